"""What a compiled, SPMD-partitioned step does: collective bytes from its HLO, memory, run time.

The compiled HLO text names operands without their shapes (``all-gather(%copy.86)``),
so every instruction's result type is read into a symbol table first and operand sizes
are looked up there. All sizes are per device (the partitioned module's shapes).

Example:
    >>> text = '''
    ... %p = f32[4,8]{1,0} parameter(0)
    ... %ag = f32[32,8]{1,0} all-gather(%p), dimensions={0}
    ... ROOT %ar = (f32[4,8]{1,0}, bf16[2]{0}) all-reduce(%p, %q), to_apply=%add
    ... %q = bf16[2]{0} parameter(1)
    ... '''
    >>> s = collective_stats(text)
    >>> s["all-gather"], s["all-reduce"]
    (CollectiveStat(count=1, operand_bytes=128, result_bytes=1024), CollectiveStat(count=1, operand_bytes=132, result_bytes=132))
"""
from __future__ import annotations

import random
import re
import statistics
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1}
_DEF = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b([a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")


@dataclass(frozen=True, slots=True)
class CollectiveStat:
    """Per-device totals for one collective kind: op count, operand bytes, result bytes."""

    count: int = 0
    operand_bytes: int = 0
    result_bytes: int = 0

    @property
    def nbytes(self) -> int:
        """The bigger side: the gathered buffer of an all-gather, the scattered input of a reduce-scatter."""
        return max(self.operand_bytes, self.result_bytes)

    def __add__(self, other: CollectiveStat) -> CollectiveStat:
        return CollectiveStat(self.count + other.count, self.operand_bytes + other.operand_bytes,
                              self.result_bytes + other.result_bytes)


def type_bytes(text: str) -> int:
    """Bytes of an HLO type (an array ``f32[4,8]{1,0}`` or a tuple of them)."""
    total = 0
    for dtype, dims in _ARRAY.findall(text):
        if dtype not in _BYTES:
            continue
        total += _BYTES[dtype] * int(np.prod([int(d) for d in dims.split(",") if d], dtype=np.int64))
    return total


def _split_type(rhs: str) -> tuple[str, str]:
    """``"(f32[2], f32[3]) all-reduce(%a, %b), ..."`` -> (type text, rest)."""
    if rhs.startswith("("):
        depth = 0
        for i, ch in enumerate(rhs):
            depth += ch == "("
            depth -= ch == ")"
            if depth == 0:
                return rhs[:i + 1], rhs[i + 1:].lstrip()
    head, _, rest = rhs.partition(" ")
    return head, rest


def _operands(rest: str) -> list[str]:
    """Operand names of ``op(%a, %b), attrs``."""
    start = rest.find("(")
    depth, end = 0, len(rest)
    for i in range(start, len(rest)):
        depth += rest[i] == "("
        depth -= rest[i] == ")"
        if depth == 0:
            end = i
            break
    return re.findall(r"%([\w.\-]+)", rest[start:end])


def collective_stats(hlo_text: str) -> dict[str, CollectiveStat]:
    """Count and size every collective of ``hlo_text`` by kind (async ``-start`` forms included)."""
    types: dict[str, str] = {}
    ops: list[tuple[str, str, list[str], bool]] = []
    for line in hlo_text.splitlines():
        m = _DEF.match(line)
        if not m:
            continue
        name, rhs = m.groups()
        ty, rest = _split_type(rhs)
        types[name] = ty
        op = rest.split("(", 1)[0].strip()
        is_async = op.endswith("-start")
        kind = op[:-len("-start")] if is_async else op
        if kind in KINDS:
            ops.append((kind, ty, _operands(rest), is_async))
    out = {k: CollectiveStat() for k in KINDS}
    for kind, ty, operands, is_async in ops:
        res = type_bytes(ty)
        if is_async and ty.startswith("("):  # an async start's tuple holds (operands, results, context)
            res = max(type_bytes(m.group(0)) for m in _ARRAY.finditer(ty))
        opnd = sum(type_bytes(types.get(o, "")) for o in operands)
        out[kind] = out[kind] + CollectiveStat(1, opnd, res)
    return out


def memory_bytes(compiled: Any) -> dict[str, int]:
    """Per-device bytes of a compiled executable: arguments, outputs, temporaries, peak.

    ``peak`` = arguments + outputs - aliased (donated buffers reused by outputs) + temporaries.
    """
    m = compiled.memory_analysis()
    arg, out, alias, temp = (int(m.argument_size_in_bytes), int(m.output_size_in_bytes),
                             int(m.alias_size_in_bytes), int(m.temp_size_in_bytes))
    return {"argument": arg, "output": out, "alias": alias, "temp": temp, "peak": arg + out - alias + temp}


def last_executable() -> Any:
    """The executable the lazy core ran last (``jax.stages.Compiled``)."""
    from xla_dtensor.core import executor

    return executor.last_executable()


def time_executable(compiled: Any, reps: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``compiled`` on fresh zero arguments laid out as it expects.

    Arguments are rebuilt (untimed) before every call because donated buffers are consumed.
    """
    import jax

    infos, shardings = _arg_layout(compiled)

    def fresh() -> list:
        args = [jax.device_put(np.zeros(i._aval.shape, i._aval.dtype), s) for i, s in zip(infos, shardings)]
        return jax.block_until_ready(args)

    times = []
    for r in range(warmup + reps):
        args = fresh()
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        if r >= warmup:
            times.append(time.perf_counter() - t0)
    return times


def _arg_layout(compiled: Any) -> tuple[list, list]:
    """Per argument of ``compiled``: its abstract value and its sharding (None: the program does not use it)."""
    import jax

    infos = jax.tree.leaves(compiled.args_info)
    # NOTE: an unused argument's sharding is None; flattening it away would shift every later position
    shardings = jax.tree.flatten(compiled.input_shardings, is_leaf=lambda x: x is None)[0]
    if len(shardings) != len(infos):
        raise ValueError(f"{len(infos)} arguments but {len(shardings)} input shardings")
    return infos, shardings


def time_interleaved(executables: dict[str, Any], reps: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per call of each executable, timed round-robin (one call of each per round).

    On a shared, noisy machine a slow spell then hits every layout of the round alike,
    so ratios between them are paired rather than taken minutes apart. Each round runs
    them in a new order (seeded shuffle): a call's time depends on the program run before
    it (whose working set is in the caches), and a fixed order gave each layout the same
    predecessor every round (two identical programs measured 1-2% apart).
    """
    import jax

    layouts = {k: _arg_layout(c) for k, c in executables.items()}
    times: dict[str, list[float]] = {k: [] for k in executables}
    names, rng = list(executables), random.Random(0)
    for r in range(warmup + reps):
        rng.shuffle(names)
        for k in names:
            c = executables[k]
            infos, shardings = layouts[k]
            args = jax.block_until_ready([jax.device_put(np.zeros(i._aval.shape, i._aval.dtype), s)
                                          for i, s in zip(infos, shardings)])
            t0 = time.perf_counter()
            jax.block_until_ready(c(*args))
            if r >= warmup:
                times[k].append(time.perf_counter() - t0)
    return times


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")
