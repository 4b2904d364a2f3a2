"""Op coverage: torch's OpInfo samples, every aten call they make, checked through an executor vs torch CPU.

For each OpInfo (``torch.testing._internal.common_methods_invocations.op_db``) and each
of its first ``--samples`` float32 sample inputs on CPU, the op runs under a
``TorchDispatchMode``. Every aten overload it dispatches is executed twice: by
torch (the oracle) and by the executor, and the outputs are compared for shape,
dtype and values. Executors (``--executor``):

* ``device`` (default): the arguments move to the lazy ``jax`` device, the op runs
  there (recorded, compiled by XLA, executed) and the outputs come back with ``.cpu()``:
  the whole path a user's program takes.
* ``lowerings``: our lowerings called eagerly on JAX arrays (decomposition fallback
  included), isolating the lowering table from the core.

Figures printed and written to ``benchmarks/results/op_coverage.md``:
* per OpInfo: supported (every aten call lowered or decomposed) and matching
  (every call equal to torch) counts;
* per Core ATen overload (``torch.Tag.core``) seen in the samples: the same.

Usage: ``PYTHONPATH=. python benchmarks/op_coverage.py [--executor device] [--samples 2] [--ops add,mul] [--limit N]``
"""
from __future__ import annotations

import argparse
import signal
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import mesh  # noqa: F401  (virtual CPU devices before JAX starts)
import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from torch.utils import _pytree as pytree  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from xla_dtensor.ops import get_lowering, is_random, next_key, resolve  # noqa: E402
from xla_dtensor.ops.dtypes import to_jax, to_torch  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "op_coverage.md"
UNSPECIFIED_VALUES = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "empty_permuted"}
HOST_OPS = {"_local_scalar_dense", "equal", "is_nonzero", "is_same_size", "sym_size", "sym_stride", "sym_numel"}


class Executor(Protocol):
    """Runs one aten call on torch-free values; returns torch tensors (or a pytree of them)."""

    name: str

    def __call__(self, op: Any, args: tuple, kwargs: dict) -> Any: ...


def _to_jnp(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            return jnp.asarray(x.float().numpy()).astype(to_jax(x.dtype))
        return jnp.asarray(x.resolve_conj().resolve_neg().numpy().copy())  # never alias torch memory
    return x


def _to_torch(x: Any) -> Any:
    if isinstance(x, jax.Array):
        if x.dtype in (jnp.bfloat16, jnp.float16):
            return torch.from_numpy(np.asarray(x.astype(jnp.float32))).to(to_torch(x.dtype))
        return torch.from_numpy(np.array(x))
    return x


@dataclass
class LoweringExecutor:
    """Our lowering table, called eagerly on JAX arrays (decomposition fallback included)."""

    name: str = "lowerings (eager, JAX CPU)"

    def __call__(self, op: Any, args: tuple, kwargs: dict) -> Any:
        jargs, jkwargs = pytree.tree_map(_to_jnp, (args, kwargs))
        fn = resolve(op, jargs, jkwargs)
        out = fn(next_key(), *jargs, **jkwargs) if is_random(op) else fn(*jargs, **jkwargs)
        return pytree.tree_map(_to_torch, out)


@dataclass
class DeviceExecutor:
    """The lazy ``jax`` device end to end: to the device, run the op, ``.cpu()`` back."""

    name: str = "lazy jax device (record, XLA compile, execute)"

    def __call__(self, op: Any, args: tuple, kwargs: dict) -> Any:
        import xla_dtensor

        # NOTE: the checker calls us below autograd, where Tensor.to does not decompose:
        # move tensors with the aten op it would decompose to.
        dev = xla_dtensor.device()
        move = torch.ops.aten._to_copy.default
        on_dev = pytree.tree_map(lambda t: move(t, device=dev) if isinstance(t, torch.Tensor) else t, (args, kwargs))
        out = op(*on_dev[0], **on_dev[1])
        if op._schema.is_mutable and (out is None or isinstance(out, (list, tuple)) and not out):
            out = on_dev[0][0]  # in-place foreach ops return nothing: compare the mutated list
        return pytree.tree_map(lambda t: move(t, device="cpu") if isinstance(t, torch.Tensor) else t, out)


EXECUTORS: dict[str, Callable[[], Executor]] = {"device": DeviceExecutor, "lowerings": LoweringExecutor}


def _close(ours: Any, ref: Any, values: bool) -> str | None:
    """None when ``ours`` matches ``ref``; else why not."""
    if isinstance(ref, (list, tuple)):
        if not isinstance(ours, (list, tuple)) or len(ours) != len(ref):
            return f"output structure {type(ours).__name__} vs {len(ref)} outputs"
        for o, r in zip(ours, ref):
            why = _close(o, r, values)
            if why:
                return why
        return None
    if not isinstance(ref, torch.Tensor):
        return None if (ref is None or ours == ref or not values) else f"value {ours!r} != {ref!r}"
    if not isinstance(ours, torch.Tensor):
        return f"got {type(ours).__name__}, expected a tensor"
    if tuple(ours.shape) != tuple(ref.shape) or ours.dtype != ref.dtype:
        return f"{ours.dtype}{list(ours.shape)} vs torch {ref.dtype}{list(ref.shape)}"
    if not values or ref.numel() == 0:
        return None
    r, o = ref.detach().cpu().resolve_conj().resolve_neg(), ours
    if r.dtype.is_floating_point or r.dtype.is_complex:
        tol = 1e-2 if r.dtype in (torch.bfloat16, torch.float16) else 1e-4
        ok = torch.allclose(o.to(r.dtype if r.is_complex() else torch.float64),
                            r.to(r.dtype if r.is_complex() else torch.float64), rtol=tol, atol=tol, equal_nan=True)
    else:
        ok = torch.equal(o, r)
    return None if ok else "values differ"


@dataclass
class Tally:
    calls: int = 0
    supported: int = 0
    matching: int = 0
    errors: list[str] = field(default_factory=list)


class _Checker(TorchDispatchMode):
    """Runs every aten call in torch and in the executor; records per-overload results."""

    def __init__(self, executor: Executor, per_op: dict[Any, Tally]) -> None:
        super().__init__()
        self.executor, self.per_op, self.failures = executor, per_op, []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name.split("::")[-1]
        if func.namespace not in ("aten", "prims") or name in HOST_OPS or name.endswith("out") \
                or "out" in kwargs:
            return func(*args, **kwargs)
        snapshot = pytree.tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, (args, kwargs))
        out = func(*args, **kwargs)
        ref = out
        if func._schema.is_mutable and out is None or (isinstance(out, (list, tuple)) and not out):
            ref = args[0]  # in-place foreach ops return nothing: the mutated lists are the outputs
        tally = self.per_op[func]
        tally.calls += 1
        try:
            ours = self.executor(func, *snapshot)
            tally.supported += 1
        except NotImplementedError as e:
            self.failures.append(f"{func}: unsupported ({str(e)[:100]})")
            tally.errors.append("unsupported")
            return out
        except Exception as e:  # noqa: BLE001 - any executor error is a failing sample
            self.failures.append(f"{func}: {type(e).__name__}: {str(e)[:100]}")
            tally.errors.append(type(e).__name__)
            return out
        values = not (is_random(func) or name in UNSPECIFIED_VALUES)
        why = _close(ours, ref, values)
        if why is None:
            tally.matching += 1
        else:
            self.failures.append(f"{func}: {why}")
            tally.errors.append(why)
        return out


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def run(executor: Executor, samples: int, names: set[str] | None, limit: int | None,
        timeout_s: int) -> tuple[dict, dict, dict]:
    from torch.testing._internal.common_methods_invocations import op_db

    per_op: dict[Any, Tally] = defaultdict(Tally)
    per_info: dict[str, dict[str, Any]] = {}
    signal.signal(signal.SIGALRM, _alarm)
    infos = [o for o in op_db if names is None or o.name in names][:limit]
    for i, info in enumerate(infos):
        key = info.name + (f".{info.variant_test_name}" if info.variant_test_name else "")
        status = {"samples": 0, "supported": True, "matching": True, "failures": []}
        if torch.float32 not in info.supported_dtypes("cpu"):
            continue
        try:
            signal.alarm(timeout_s)
            for n, sample in enumerate(info.sample_inputs("cpu", torch.float32, requires_grad=False)):
                if n >= samples:
                    break
                checker = _Checker(executor, per_op)
                try:
                    with checker:
                        info.op(sample.input, *sample.args, **sample.kwargs)
                except _Timeout:
                    raise
                except Exception:  # noqa: BLE001 - torch itself rejects the sample: not counted
                    continue
                status["samples"] += 1
                status["failures"] += checker.failures
            signal.alarm(0)
        except _Timeout:
            status["failures"].append(f"timed out after {timeout_s}s")
        signal.alarm(0)
        if not status["samples"]:
            continue
        fails = status["failures"]
        status["supported"] = not any("unsupported" in f or "timed out" in f for f in fails)
        status["matching"] = not fails
        per_info[key] = status
        if i % 25 == 0:
            print(f"  [{i}/{len(infos)}] {key}", file=sys.stderr, flush=True)
    core = {op: t for op, t in per_op.items() if torch.Tag.core in getattr(op, "tags", ())}
    return per_info, per_op, core


def _pct(a: int, b: int) -> str:
    return f"{100.0 * a / b:.1f}%" if b else "n/a"


def report(executor: Executor, per_info: dict, per_op: dict, core: dict, seconds: float, samples: int) -> str:
    n = len(per_info)
    sup = sum(s["supported"] for s in per_info.values())
    match = sum(s["matching"] for s in per_info.values())
    ops_sup = sum(t.supported == t.calls for t in per_op.values())
    ops_match = sum(t.matching == t.calls for t in per_op.values())
    core_sup = sum(t.supported == t.calls for t in core.values())
    core_match = sum(t.matching == t.calls for t in core.values())
    rows = [
        ("OpInfo entries (float32 samples run)", n, sup, match),
        ("aten overloads dispatched", len(per_op), ops_sup, ops_match),
        ("  of which Core ATen (torch.Tag.core)", len(core), core_sup, core_match),
    ]
    lines = [f"# Op coverage: {executor.name}", "",
             f"torch {torch.__version__}, jax {jax.__version__}; first {samples} float32 sample(s) per OpInfo; "
             f"{seconds:.0f} s.", "",
             "| scope | total | supported | % | matching torch CPU | % |", "|---|---|---|---|---|---|"]
    for label, total, s, m in rows:
        lines.append(f"| {label} | {total} | {s} | {_pct(s, total)} | {m} | {_pct(m, total)} |")
    lines += ["", "supported = every call lowered directly or through torch's decomposition table; "
              "matching = also equal to torch CPU in shape, dtype and values (random ops and `empty*`: "
              "shape and dtype only).", "", "## Failing Core ATen overloads", ""]
    for op, t in sorted(core.items(), key=lambda kv: str(kv[0])):
        if t.matching != t.calls:
            lines.append(f"- `{op}`: {t.calls - t.matching}/{t.calls} calls fail ({'; '.join(sorted(set(t.errors)))[:160]})")
    lines += ["", "## Failing OpInfo entries", ""]
    for key, s in sorted(per_info.items()):
        if not s["matching"]:
            lines.append(f"- `{key}`: {s['failures'][0][:200]}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=2, help="samples per OpInfo (default 2)")
    p.add_argument("--ops", default=None, help="comma-separated OpInfo names (default: all)")
    p.add_argument("--limit", type=int, default=None, help="first N OpInfos only")
    p.add_argument("--timeout", type=int, default=60, help="seconds per OpInfo")
    p.add_argument("--executor", choices=sorted(EXECUTORS), default="device",
                   help="device: through the lazy jax device (default); lowerings: the table alone")
    p.add_argument("--out", default=None, help=f"markdown report (default {RESULTS.parent}/op_coverage[_EXECUTOR].md)")
    a = p.parse_args(argv)
    executor = EXECUTORS[a.executor]()
    if a.out is None:
        a.out = str(RESULTS if a.executor == "device" else RESULTS.with_name(f"op_coverage_{a.executor}.md"))
    t0 = time.time()
    per_info, per_op, core = run(executor, a.samples, set(a.ops.split(",")) if a.ops else None, a.limit, a.timeout)
    text = report(executor, per_info, per_op, core, time.time() - t0, a.samples)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(text)
    print(text.split("## Failing OpInfo")[0])
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
