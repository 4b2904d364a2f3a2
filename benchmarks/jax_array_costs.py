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
import numpy as np
from jax.sharding import AxisType, NamedSharding, PartitionSpec, SingleDeviceSharding

from benchmarks._plots import paired_bars

RESULTS = Path(__file__).resolve().parent / "results"
PARTS = ("call, per input", "call, per output", "call, donated chain", "destroy, donated", "destroy, live")
GPT_STEP = {"inputs": 596, "outputs": 590, "donated": 588}  # the 12-layer benchmark GPT's lazy step


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
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "jax_array_costs.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "jax_array_costs.json").write_text(json.dumps({"rows": rows, "floor_ms": floors, "gpt_step": GPT_STEP,
                                                               "arrays": a.arrays, "reps": a.reps}, indent=1))
    print("\n".join(lines))
    paired_bars(RESULTS / "jax_array_costs.png", list(PARTS), [one[k] for k in PARTS],
                [rows["2x4, split on model"][k] for k in PARTS], ("one device", "2x4, split on model"),
                "calling-thread us / array", "jax runtime work per array: one device vs 8")


if __name__ == "__main__":
    main()
