"""torchtitan's Llama (complex rotary embeddings): compiles per step and steady step time, per mode.

The tiny debug model (dim 64, 2 layers, 4 heads, vocab 64, batch 8x16) trains 5 AdamW
steps on the jax device in each mode: lazy single device, ``xla_dtensor.compile``,
eager mode, FSDP on 1x8, AUTO (``distribute_module(partition_fn="AUTO")``) on 1x8 and
2x4. Reported: programs compiled in each of the first 5 steps and whether their losses
match torch CPU (rtol 1e-3); then 12 more steps are timed, each waited for: the fastest
(``steady ms``: on a shared machine the least disturbed) and the median.

``--before`` reproduces how the model ran before the complex lowerings existed: the
lowerings of ``view_as_complex`` / ``view_as_real`` / ``polar`` / ``complex`` / ``imag``
are removed and ``config.cpu_fallback`` is on, so those ops run on CPU (each fallback
syncs what it reads). Each (variant, mode) runs in its own process. Prints a table;
saves ``benchmarks/results/titan_steady.{md,json,png}``. A benchmark, not a test.

Usage: PYTHONPATH=. python benchmarks/titan_steady.py [--modes single,compile,...]
       PYTHONPATH=. python benchmarks/titan_steady.py --one MODE [--before]   (one run, prints JSON)
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
MODES = ("single", "compile", "eager", "fsdp_1x8", "auto_1x8", "auto_2x4")
STEPS = 5
TIMED = 12  # further steady steps, timed


def _model() -> tuple:
    import torch
    from torchtitan.models.llama3 import Transformer, llama3_args
    torch.manual_seed(0)
    args = dataclasses.replace(llama3_args["debugmodel"], dim=64, n_layers=2, n_heads=4, vocab_size=64,
                               multiple_of=32, max_seq_len=64)
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    g = torch.Generator().manual_seed(1)
    return model, [torch.randint(0, 64, (8, 16), generator=g) for _ in range(STEPS + TIMED)]


def _loss(model, ids):
    import torch
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def one(mode: str, before: bool) -> dict:
    """Train in ``mode`` (in this process); compiles per step, step times, CPU agreement."""
    import numpy as np
    import torch

    import xla_dtensor
    from xla_dtensor import metrics
    if before:
        from xla_dtensor.ops import registry
        for name in ("view_as_complex", "view_as_real", "polar", "complex", "imag"):
            registry._LOWERINGS.pop(getattr(torch.ops.aten, name).default, None)
        xla_dtensor.config.cpu_fallback = True
    model, batches = _model()
    ref = copy.deepcopy(model)
    opt_ref = torch.optim.AdamW(ref.parameters(), lr=1e-3)
    want = []
    for ids in batches[:STEPS]:
        loss = _loss(ref, ids)
        loss.backward()
        opt_ref.step()
        opt_ref.zero_grad()
        want.append(loss.item())
    dev = xla_dtensor.device()
    if mode == "fsdp_1x8":
        from xla_dtensor.fsdp import shard_model
        shard_model(model, xla_dtensor.Mesh(range(8), (8,), ("fsdp",)))
    elif mode.startswith("auto"):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import distribute_module
        shape = (1, 8) if mode == "auto_1x8" else (2, 4)
        dm = DeviceMesh("xla", np.arange(8).reshape(shape).tolist(), mesh_dim_names=("data", "model"))
        distribute_module(model, dm, partition_fn="AUTO")
    else:
        model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step(model, opt, ids):
        loss = _loss(model, ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    run = xla_dtensor.compile(step) if mode == "compile" else step
    xla_dtensor.eager_mode(mode == "eager")
    got, compiles, times = [], [], []
    late = 0  # programs compiled after step 2, over all 17 steps
    for k, ids in enumerate(batches):
        c0 = metrics.counters()["compiles"]
        t0 = time.perf_counter()
        loss = run(model, opt, ids.to(dev))
        xla_dtensor.sync()
        xla_dtensor.wait()
        times.append(time.perf_counter() - t0)
        if k >= 2:
            late += metrics.counters()["compiles"] - c0
        if k < STEPS:
            got.append(loss.item())
            compiles.append(metrics.counters()["compiles"] - c0)
    xla_dtensor.eager_mode(False)
    ok = all(abs(a - b) <= 1e-3 * abs(b) for a, b in zip(got, want))
    steady = times[STEPS:]
    return {"mode": mode, "before": before, "compiles": compiles, "steady_ms": min(steady) * 1e3,
            "steady_median_ms": statistics.median(steady) * 1e3, "matches_cpu": ok, "compiles_after_step2": late,
            "cpu_fallbacks": metrics.counters()["cpu_fallbacks"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--one", default=None)
    ap.add_argument("--before", action="store_true")
    a = ap.parse_args()
    from benchmarks._plots import paired_bars
    if a.one:
        print("RESULT " + json.dumps(one(a.one, a.before)))
        return
    rows = []
    for mode in a.modes.split(","):
        for before in (True, False):
            cmd = [sys.executable, __file__, "--one", mode] + (["--before"] if before else [])
            out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), check=False)
            line = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
            r = json.loads(line[-1][7:]) if line else {"mode": mode, "before": before, "error": out.stderr[-500:]}
            rows.append(r)
            print(r, flush=True)
    lines = ["torchtitan Llama debug model (dim 64, 2 layers), 5 AdamW steps, 8 virtual CPU devices. before: "
             "complex ops on CPU (cpu_fallback), as before their lowerings; after: this tree.", "",
             "| mode | compiles per step (before) | steady ms (before) | compiles per step (after) | steady ms (after) "
             "| after/before | median ms before / after | compiles in steps 3-17 before / after | matches CPU (after) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for mode in a.modes.split(","):
        b = next(r for r in rows if r["mode"] == mode and r["before"])
        n = next(r for r in rows if r["mode"] == mode and not r["before"])
        if "error" in b or "error" in n:
            lines.append(f"| {mode} | error | | | | | | | |")
            continue
        lines.append(f"| {mode} | {b['compiles']} | {b['steady_ms']:.1f} | {n['compiles']} | {n['steady_ms']:.1f} | "
                     f"{n['steady_ms'] / b['steady_ms']:.2f} | {b['steady_median_ms']:.1f} / {n['steady_median_ms']:.1f} | "
                     f"{b['compiles_after_step2']} / {n['compiles_after_step2']} | {n['matches_cpu']} |")
    single = next((r for r in rows if r["mode"] == "single" and not r["before"] and "error" not in r), None)
    if single:
        lines += ["", "Steady step relative to single device (after): " + ", ".join(
            f"{r['mode']} {r['steady_ms'] / single['steady_ms']:.2f}x" for r in rows
            if not r["before"] and "error" not in r)]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "titan_steady.md").write_text("\n".join(lines) + "\n")
    (RESULTS / "titan_steady.json").write_text(json.dumps(rows, indent=1))
    print("\n".join(lines))
    ok = [m for m in a.modes.split(",") if all("error" not in r for r in rows if r["mode"] == m)]

    def steady(m: str, before: bool) -> float:
        return next(r for r in rows if r["mode"] == m and r["before"] == before)["steady_ms"]
    paired_bars(RESULTS / "titan_steady.png", ok, [steady(m, True) for m in ok], [steady(m, False) for m in ok],
                ("before (complex ops on CPU)", "after (lowered)"), "steady step (ms)",
                "torchtitan Llama (complex rotary): steady step per mode", log=True)


if __name__ == "__main__":
    main()
