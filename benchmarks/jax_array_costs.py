"""What jax's runtime charges the calling thread per array, on one device and sharded over 8.

A lazy step hands its state to one jitted program and gets it back: the 12-layer benchmark GPT
(``benchmarks/lazy_overhead.py``) passes 596 arrays in (588 donated) and takes 590 out, and at the
next sync the old arrays (donated, so already empty) are destroyed. None of that is the recorder's
work, but all of it runs on the calling thread. This measures each part alone, per array, with
jax only (no torch, no xla_dtensor): ``--arrays`` arrays of (8, 64) float32, replicated
(``P()``) or split on the model axis (``P(None, 'model')``) of a 2x4 mesh, against the same
arrays on one device.

* ``call, per input``: a compiled program taking every array and returning one scalar.
* ``call, per output``: a compiled program taking one array and returning ``--arrays``.
* ``call, donated chain``: ``xs = f(*xs)`` with every input donated, as a lazy step runs
  (includes dropping the previous ``xs``).
* ``destroy, donated`` / ``destroy, live``: ``del`` of a list of donated (empty) arrays / of
  arrays holding their buffers.

Calling-thread CPU us per array (``time.thread_time``), the median of ``--reps`` runs. The last
line applies the per-array differences to the GPT step's counts: what 8 devices add to one
device's step before any recording, the floor under a sharded / one-device host-time ratio.

Then the way under that floor, measured: the GPT step's optimizer state (its 196 parameters,
74 of (64, 64) and 122 of (64,), each with AdamW's two moments: 588 arrays) run as a chain
of AdamW updates with every input donated, held two ways:

* ``one array per tensor``: as the lazy core holds it today;
* ``packed by layout``: one array per (role, layout): each (64, 64) tensor split on the model
  axis is laid out shard-major (``(4, 64 * 16)``, a reshape and a transpose that stay on each
  device), and the tensors of a group written back into the donated input in place
  (``dynamic_update_slice``), 6 arrays in all.

Per layout (one device; 2x4 with the (64, 64) tensors split on the model axis and the rest
replicated): the calling thread's ms per step (the call and dropping the last step's arrays),
the wall ms per step run back to back (the device's time, the host's being far less), and the
collectives in the packed program (0: packing moves no data between devices).

Last, whether freeing arrays needs the GIL (``xla_dtensor/core/reaper.py`` frees a sync's old graph on
a helper thread): per layout, a pure-Python loop's wall ms alone and beside a helper thread that frees
``--arrays`` donated arrays, the same free's calling-thread ms inline, and the helper's CPU ms. A loop as
fast beside the helper as alone means the free ran without the GIL.

Usage: PYTHONPATH=. python benchmarks/jax_array_costs.py [--arrays 600] [--reps 15]

Writes ``benchmarks/results/jax_array_costs.{md,json,png}``. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any, Callable

import xla_dtensor  # noqa: F401,I001  (sets up the 8 CPU devices before jax starts)
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec, SingleDeviceSharding

from benchmarks._plots import paired_bars

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("call, per input", "call, per output", "call, donated chain", "destroy, donated", "destroy, live")
GPT_STEP = {"inputs": 596, "outputs": 590, "donated": 588}  # the 12-layer benchmark GPT's lazy step
GPT_PARAMS = ((74, (64, 64)), (122, (64,)))  # its parameters: (how many, shape)
COLLECTIVES = ("all-reduce", "all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def _median_us(run: Callable[[], float], reps: int, n: int) -> float:
    """Median over ``reps`` runs of ``run()`` (calling-thread seconds), in us per array of ``n``."""
    run()  # warm
    return statistics.median(run() for _ in range(reps)) / n * 1e6


def _timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    c0 = time.thread_time()
    out = fn()
    return time.thread_time() - c0, out


def measure(sharding: Any, n: int, reps: int) -> dict[str, float]:
    """Per-array calling-thread us of each part of :data:`PARTS` for ``n`` arrays laid out as ``sharding``."""
    host = np.ones((8, 64), np.float32)

    def fresh() -> list[Any]:
        return [jax.device_put(host, sharding) for _ in range(n)]

    xs = fresh()
    to_one = jax.jit(lambda *a: sum(x[0, 0] for x in a)).lower(*xs).compile()
    to_many = jax.jit(lambda x: [x * (i + 1) for i in range(n)]).lower(xs[0]).compile()
    chain = jax.jit(lambda *a: [x * 1.0001 for x in a], donate_argnums=tuple(range(n))).lower(*xs).compile()

    def run_in() -> float:
        dt, out = _timed(lambda: to_one(*xs))
        jax.block_until_ready(out)
        return dt

    def run_out() -> float:
        dt, out = _timed(lambda: to_many(xs[0]))
        jax.block_until_ready(out)
        return dt

    state = {"xs": fresh()}

    def run_chain() -> float:
        c0 = time.thread_time()
        state["xs"] = chain(*state["xs"])
        dt = time.thread_time() - c0
        jax.block_until_ready(state["xs"])
        return dt

    def run_destroy(donated: bool) -> float:
        old = fresh()
        new = chain(*old) if donated else None
        jax.block_until_ready(new if donated else old)
        dt, _ = _timed(lambda: old.clear())
        del new
        return dt

    return {PARTS[0]: _median_us(run_in, reps, n), PARTS[1]: _median_us(run_out, reps, n),
            PARTS[2]: _median_us(run_chain, reps, n), PARTS[3]: _median_us(lambda: run_destroy(True), reps, n),
            PARTS[4]: _median_us(lambda: run_destroy(False), reps, n)}


def floor_ms(one: dict[str, float], many: dict[str, float]) -> float:
    """What the 8-device layout adds to the GPT step's runtime work (ms): inputs, outputs, donated destroys."""
    d = {k: many[k] - one[k] for k in PARTS}
    return (d[PARTS[0]] * GPT_STEP["inputs"] + d[PARTS[1]] * GPT_STEP["outputs"]
            + d[PARTS[3]] * GPT_STEP["donated"]) / 1e3


def _adamw(p: Any, m: Any, v: Any) -> tuple[Any, Any, Any]:
    g = p * 0.01  # a stand-in gradient: the update's arithmetic, not a model's
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m / (jnp.sqrt(v) + 1e-8) + 0.01 * p), m, v


def _shard_major(x: Any, k: int) -> Any:
    """(a, b) split on dim 1 ``k`` ways -> (k, a * b / k): each device's shard one contiguous row."""
    a, b = x.shape
    return x.reshape(a, k, b // k).transpose(1, 0, 2).reshape(k, a * b // k)


def _from_shard_major(y: Any, a: int, b: int, k: int) -> Any:
    return y.reshape(k, a, b // k).transpose(1, 0, 2).reshape(a, b)


def state_chain(mesh: Any, packed: bool) -> tuple[Callable[..., Any], list[Any]]:
    """The GPT step's AdamW state chain (``mesh``: None for one device), compiled, and its state."""
    one = SingleDeviceSharding(jax.devices()[0])
    split = one if mesh is None else NamedSharding(mesh, PartitionSpec(None, "model"))
    repl = one if mesh is None else NamedSharding(mesh, PartitionSpec())
    groups = [(n, shape, split if len(shape) == 2 else repl) for n, shape in GPT_PARAMS]
    if not packed:
        tensors = [(shape, sh) for n, shape, sh in groups for _ in range(n)]
        state = [jax.device_put(np.full(shape, 0.5, np.float32), sh) for _ in range(3) for shape, sh in tensors]
        t = len(tensors)

        def step(*xs: Any) -> list[Any]:
            new = [_adamw(*pmv) for pmv in zip(xs[:t], xs[t:2 * t], xs[2 * t:])]
            return [x[role] for role in range(3) for x in new]
        shardings = [sh for _ in range(3) for _, sh in tensors]
    else:
        k = 1 if mesh is None else mesh.shape["model"]
        packs = []  # per group: (count, shape, rows, row length, the packed array's sharding)
        for n, shape, sh in groups:
            if len(shape) == 2 and k > 1:
                packs.append((n, shape, k, shape[0] * shape[1] // k, NamedSharding(mesh, PartitionSpec("model", None))))
            else:
                packs.append((n, shape, 1, int(np.prod(shape)), repl))

        def unpack(y: Any, n: int, shape: tuple, rows: int, size: int) -> list[Any]:
            parts = [jax.lax.slice_in_dim(y, i * size, (i + 1) * size, axis=1) for i in range(n)]
            return [p.reshape(shape) if rows == 1 else _from_shard_major(p, *shape, rows) for p in parts]

        def repack(y: Any, xs: list[Any], rows: int, size: int) -> Any:
            for i, x in enumerate(xs):  # in place: y is donated
                y = jax.lax.dynamic_update_slice_in_dim(y, x.reshape(1, size) if rows == 1 else _shard_major(x, rows),
                                                        i * size, axis=1)
            return y

        def step(*ys: Any) -> list[Any]:
            out = []
            for g, (n, shape, rows, size, _) in enumerate(packs):
                pmv = [unpack(ys[3 * g + role], n, shape, rows, size) for role in range(3)]
                new = [_adamw(*x) for x in zip(*pmv)]
                out += [repack(ys[3 * g + role], [x[role] for x in new], rows, size) for role in range(3)]
            return out
        shardings = [sh for *_, sh in packs for _ in range(3)]
        state = [jax.device_put(np.full((rows, n * size), 0.5, np.float32), sh)
                 for n, _, rows, size, sh in packs for _ in range(3)]
    compiled = jax.jit(step, donate_argnums=tuple(range(len(state))),
                       out_shardings=shardings).lower(*state).compile()
    return compiled, state


def measure_chain(mesh: Any, packed: bool, reps: int) -> dict[str, float]:
    """Host ms per step, back-to-back wall ms per step, arrays and collectives of :func:`state_chain`."""
    compiled, state = state_chain(mesh, packed)
    text = compiled.as_text()
    box = {"state": state}
    del state

    def step() -> None:  # the last step's arrays are dropped here, inside the clock
        box["state"] = compiled(*box["state"])
    for _ in range(3):
        step()
    host = []
    for _ in range(reps):
        jax.block_until_ready(box["state"])
        host.append(_timed(step)[0])
    jax.block_until_ready(box["state"])
    w0 = time.perf_counter()
    for _ in range(reps):
        step()
    jax.block_until_ready(box["state"])
    return {"arrays": len(box["state"]), "host_ms": 1e3 * statistics.median(host),
            "wall_ms": 1e3 * (time.perf_counter() - w0) / reps,
            "collectives": sum(text.count(f" {c}(") + text.count(f" {c}-start(") for c in COLLECTIVES)}


def _loop_ms(n: int = 300_000) -> float:
    """Wall ms of a pure-Python loop (it holds the GIL throughout)."""
    w0, total = time.perf_counter(), 0
    for i in range(n):
        total += i
    return 1e3 * (time.perf_counter() - w0)


def measure_free_beside(sharding: Any, n: int, reps: int) -> dict[str, float]:
    """Medians over ``reps``: the loop alone, beside a helper freeing ``n`` donated arrays, the free inline
    (calling-thread ms) and on the helper (its CPU ms)."""
    import threading
    host = np.ones((8, 64), np.float32)
    xs = [jax.device_put(host, sharding) for _ in range(n)]
    chain = jax.jit(lambda *a: [x * 1.0001 for x in a], donate_argnums=tuple(range(n))).lower(*xs).compile()
    got: dict[str, list[float]] = {"loop alone": [], "loop beside the helper": [], "free inline": [],
                                   "free on the helper (CPU)": []}

    def step(old: list[Any]) -> tuple[list[Any], list[Any]]:
        new = chain(*old)
        jax.block_until_ready(new)
        return new, old

    for _ in range(reps):
        xs, old = step(xs)
        got["loop alone"].append(_loop_ms())
        box, cpu = [old], []
        del old
        helper = threading.Thread(target=lambda: cpu.append(_timed(box.clear)[0]))
        helper.start()
        got["loop beside the helper"].append(_loop_ms())
        helper.join()
        got["free on the helper (CPU)"].append(1e3 * cpu[0])
        xs, old = step(xs)
        got["free inline"].append(1e3 * _timed(old.clear)[0])
        del old
    return {k: statistics.median(v) for k, v in got.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arrays", type=int, default=600)
    ap.add_argument("--reps", type=int, default=15)
    a = ap.parse_args()
    if len(jax.devices()) < 8:
        raise SystemExit(f"needs 8 devices, jax sees {len(jax.devices())}: "
                         "set XLA_FLAGS=--xla_force_host_platform_device_count=8 before jax starts")
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    layouts = {"one device": SingleDeviceSharding(jax.devices()[0]),
               "2x4, replicated": NamedSharding(mesh, PartitionSpec()),
               "2x4, split on model": NamedSharding(mesh, PartitionSpec(None, "model"))}
    rows = {}
    for name, sh in layouts.items():
        rows[name] = measure(sh, a.arrays, a.reps)
        print(f"{name:<20} " + "  ".join(f"{k} {v:5.2f}" for k, v in rows[name].items()), flush=True)
    one = rows["one device"]
    floors = {name: floor_ms(one, r) for name, r in rows.items() if name != "one device"}
    lines = [f"{a.arrays} arrays of (8, 64) float32; calling-thread CPU us per array, the median of {a.reps} runs "
             f"(jax {jax.__version__}, {jax.devices()[0].platform}).", "",
             "| part | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    lines += [f"| {k} | " + " | ".join(f"{r[k]:.2f}" for r in rows.values()) + " |" for k in PARTS]
    lines += ["", f"On the 12-layer GPT step ({GPT_STEP['inputs']} inputs, {GPT_STEP['outputs']} outputs, "
              f"{GPT_STEP['donated']} donated arrays destroyed at the next sync), 8 devices add to one device's "
              "runtime work: " + ", ".join(f"{k} {v:.2f} ms" for k, v in floors.items()) + "."]
    chains = {f"{where}, {how}": measure_chain(m, packed, a.reps)
              for where, m in (("one device", None), ("2x4", mesh))
              for how, packed in (("one array per tensor", False), ("packed by layout", True))}
    lines += ["", "The GPT step's AdamW state (588 tensors) as a donated chain of updates: calling-thread ms per step, "
              f"back-to-back wall ms per step, the median of {a.reps} steps.", "",
              "| layout, state | arrays | host ms | wall ms | collectives |", "|---|---|---|---|---|"]
    lines += [f"| {k} | {r['arrays']} | {r['host_ms']:.2f} | {r['wall_ms']:.2f} | {r['collectives']} |"
              for k, r in chains.items()]
    frees = {name: measure_free_beside(sh, a.arrays, a.reps) for name, sh in layouts.items()}
    cols = list(next(iter(frees.values())))
    lines += ["", f"Freeing {a.arrays} donated arrays beside a pure-Python loop: ms, the median of {a.reps} runs.", "",
              "| layout | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
    lines += [f"| {name} | " + " | ".join(f"{r[c]:.2f}" for c in cols) + " |" for name, r in frees.items()]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "jax_array_costs.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "jax_array_costs.json").write_text(json.dumps({"rows": rows, "floor_ms": floors, "gpt_step": GPT_STEP,
                                                               "state_chain": chains, "free_beside": frees,
                                                               "arrays": a.arrays,
                                                               "reps": a.reps}, indent=1))
    print("\n".join(lines))
    paired_bars(RESULTS / "jax_array_costs.png", list(PARTS), [one[k] for k in PARTS],
                [rows["2x4, split on model"][k] for k in PARTS], ("one device", "2x4, split on model"),
                "calling-thread us / array", "jax runtime work per array: one device vs 8")
    kinds = [f"{w}, {m}" for w in ("one device", "2x4") for m in ("host", "wall")]
    per = {how: [chains[f"{w}, {how}"][f"{m}_ms"] for w in ("one device", "2x4") for m in ("host", "wall")]
           for how in ("one array per tensor", "packed by layout")}
    paired_bars(RESULTS / "jax_array_costs_packed.png", kinds, per["one array per tensor"], per["packed by layout"],
                ("one array per tensor", "packed by layout"), "ms per step",
                "the GPT step's AdamW state: 588 arrays vs packed by layout")


if __name__ == "__main__":
    main()
