"""Cost of ``xla_dtensor.config.check_indices`` on a GPT-2 training step.

The step (forward, backward, AdamW, ``sync()``) of the benchmark GPT-2 on the jax
device, with the bounds checks off and on (the embedding lookups of tokens and
positions and the loss's targets are checked: three small check outputs read back at
the sync). Lazy mode is measured two ways: each step waited for (``wait``), and steps
back to back with one wait at the end (``pipelined``: the check's read makes each
sync wait for its program, so tracing step N+1 no longer overlaps running step N).
Eager mode checks by default. Off/on runs alternate, ``--reps`` times; the fastest
run's wall ms and process CPU ms (all threads) per step (on a shared machine the
fastest run is the least disturbed; medians moved by +-20% between runs). Prints a table; saves ``benchmarks/results/index_check_cost.{md,json,png}``.
A benchmark, not a test.

Usage: PYTHONPATH=. python benchmarks/index_check_cost.py [--steps 20] [--reps 5] [--layers 2]
"""
from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path
from typing import Any

import xla_dtensor  # noqa: I001  (sets up devices before jax)
import torch

from benchmarks._plots import paired_bars
from benchmarks.models import GPT2, GPT2Config

RESULTS = Path(__file__).resolve().parent / "results"


def _loop(model: torch.nn.Module, opt: Any, batch: list, steps: int, wait_each: bool) -> tuple[float, float]:
    """(wall ms, process CPU ms: all threads) per training step over ``steps`` steps."""
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        loss = model(*batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        if wait_each:
            xla_dtensor.wait()
    xla_dtensor.wait()
    return (time.perf_counter() - t0) / steps * 1e3, (time.process_time() - c0) / steps * 1e3


def measure(mode: str, checks: bool, base: torch.nn.Module, batch: list, steps: int) -> tuple[float, float]:
    dev = xla_dtensor.device()
    model = copy.deepcopy(base).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    b = [t.to(dev) for t in batch]
    xla_dtensor.config.check_indices = checks
    xla_dtensor.eager_mode(mode == "eager")
    try:
        _loop(model, opt, b, 3, True)  # optimizer state, compiles
        return _loop(model, opt, b, steps, mode != "lazy pipelined")
    finally:
        xla_dtensor.eager_mode(False)
        xla_dtensor.config.check_indices = None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--layers", type=int, default=2)
    a = ap.parse_args()
    torch.manual_seed(0)
    cfg = GPT2Config(vocab=512, n_positions=64, n_embd=128, n_layer=a.layers, n_head=4)
    base = GPT2(cfg)
    g = torch.Generator().manual_seed(1)
    batch = [torch.randint(0, cfg.vocab, (8, 64), generator=g) for _ in range(2)]
    rows = []
    for mode in ("lazy wait", "lazy pipelined", "eager"):
        off, on = [], []
        for _ in range(a.reps):
            off.append(measure(mode, False, base, batch, a.steps))
            on.append(measure(mode, True, base, batch, a.steps))
        r = {"mode": mode, "off_all": off, "on_all": on}
        for k, i in (("", 0), ("cpu_", 1)):
            r[k + "off_ms"] = min(x[i] for x in off)
            r[k + "on_ms"] = min(x[i] for x in on)
            r[k + "overhead_pct"] = (r[k + "on_ms"] / r[k + "off_ms"] - 1) * 100
        rows.append(r)
        print(f"{mode:<15} wall off {r['off_ms']:8.2f} on {r['on_ms']:8.2f} ms ({r['overhead_pct']:+6.1f}%)  "
              f"CPU off {r['cpu_off_ms']:8.2f} on {r['cpu_on_ms']:8.2f} ms ({r['cpu_overhead_pct']:+6.1f}%)",
              flush=True)
    lines = [f"GPT-2 ({a.layers} layers, d=128, vocab 512, batch 8x64) training step, the fastest of {a.reps} runs "
             f"of {a.steps} steps (the least disturbed on a shared machine); off/on alternating. Wall ms per step, "
             f"and the process's CPU ms per step (all threads).", "",
             "| mode | off: wall ms | on: wall ms | wall overhead | off: CPU ms | on: CPU ms | CPU overhead |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['mode']} | {r['off_ms']:.2f} | {r['on_ms']:.2f} | {r['overhead_pct']:+.1f}% | "
              f"{r['cpu_off_ms']:.2f} | {r['cpu_on_ms']:.2f} | {r['cpu_overhead_pct']:+.1f}% |" for r in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "index_check_cost.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "index_check_cost.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    paired_bars(RESULTS / "index_check_cost.png", [r["mode"] for r in rows], [r["cpu_off_ms"] for r in rows],
                [r["cpu_on_ms"] for r in rows], ("check_indices off", "check_indices on"), "process CPU ms / step",
                "GPT-2 step: cost of index bounds checks")


if __name__ == "__main__":
    main()
