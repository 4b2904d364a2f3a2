"""Fit the ``cpu`` preset's roofline and link numbers to measured training-step times.

``calibrate_cpu.py`` times kernels in isolation. Inside a training step the virtual
devices behave differently (collectives in the middle of a program run several times
slower than an isolated ``psum``), so this script takes the step times that
``auto_vs_manual.py`` measured for every manual strategy (``results/auto_vs_manual.json``)
and fits the cost model's own terms to them. For each (model, mesh, strategy) it
evaluates the strategy's plan under four probe topologies, each isolating one term:

* ``F``: flops per device (peak 1 flop/s, free memory and links);
* ``M``: bytes moved per device, as the cost model counts them (fused elementwise
  ops move none);
* ``A``: collectives started (latency 1 s, infinite bandwidth);
* ``B``: collective bytes in link-model units (bandwidth 1 byte/s, no latency).

and fits ``t = F / peak + M / bandwidth + A * alpha + B / link bandwidth`` by
non-negative least squares on relative error, with ``peak`` fixed to the matmul rate
``calibrate_cpu.py`` measures (``--free-peak`` fits it too). It prints the fit, how
often the fitted model picks a strategy within 10% of the measured best, the same
with each model left out of the fit, and saves ``results/fit_cpu_preset.{md,png}``.

The fit does not change the preset by itself: the manual strategies' activations are
completed by the cost model under the current preset, so a refitted preset changes the
features it was fitted on (iterate, and compare AUTO's measured steps, before adopting
one). The strategies' measured programs are Shardy's completion, not the model's, which
the fit cannot see: one reason Megatron TP measures 2-3x its modelled time (its
compiled GPT-2 program all-reduces attention-score tensors no modelled plan forms).

    PYTHONPATH=. python benchmarks/fit_cpu_preset.py [--free-peak] [--peak 27e9]
"""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import argparse
import json
import math
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from autoshard.api import axis_kinds
from autoshard.build import build_model
from autoshard.solver.evaluate import evaluate
from benchmarks._cases import MODELS, virtual_meshes
from benchmarks._strategies import MANUAL, completed, manual_specs
from benchmarks.auto_vs_manual import _trace
from mesh import Link, topology_for
from mesh.topology import DeviceSpec

RESULTS = Path(__file__).parent / "results"
TERMS = ("F", "M", "A", "B")
_PROBES = {"F": (1.0, math.inf, 0.0, 0.0), "M": (math.inf, 1.0, 0.0, 0.0),
           "A": (math.inf, math.inf, 1.0, 0.0), "B": (math.inf, math.inf, 0.0, 1.0)}


def _probe(topo, peak: float, bandwidth: float, alpha: float, beta: float):
    device = DeviceSpec("probe", peak, bandwidth, topo.device.memory_bytes)
    return replace(topo, device=device, links=tuple(Link(link.kind, alpha, beta) for link in topo.links))


def features(measured: dict[tuple[str, str, str], float]) -> list[dict]:
    """One row per measured (model, mesh, manual strategy): the four terms and the time."""
    rows = []
    for case in MODELS:
        graph = None
        for where, m in virtual_meshes().items():
            keys = [k for k in measured if k[:2] == (case.name, where)]
            if not keys:
                continue
            graph = graph or _trace(case, case.batch_size)
            topo = topology_for(m, "cpu")
            model = build_model(graph, topo, float(topo.device.memory_bytes))
            probes = {t: build_model(graph, _probe(topo, *_PROBES[t])).problem for t in TERMS}
            for strat in MANUAL:
                specs = manual_specs(graph, strat, tuple(topo.axis_sizes), axis_kinds(m, topo), case.tp)
                if specs is None or (case.name, where, strat) not in measured:
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    full = completed(model, specs)
                row = dict(model=case.name, where=where, strategy=strat,
                           seconds=measured[(case.name, where, strat)] * 1e-3)
                row.update({t: evaluate(probes[t], full)[0] for t in TERMS})
                rows.append(row)
                print(f"  {case.name:13s} {where:14s} {strat:16s} measured {row['seconds'] * 1e3:7.1f} ms", flush=True)
    return rows


def fit(rows: list[dict], peak: float | None) -> np.ndarray:
    """Coefficients (s/flop, s/byte, s/collective, s per link-model byte), all >= 0."""
    x = np.array([[r[t] for t in TERMS] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    w = 1.0 / y
    if peak is None:
        coef, _ = nnls(x * w[:, None], y * w)
        return coef
    rest, _ = nnls(x[:, 1:] * w[:, None], (y - x[:, 0] / peak) * w)
    return np.r_[1.0 / peak, rest]


def picks(rows: list[dict], pred: np.ndarray) -> tuple[int, int, list[str]]:
    """Cases whose cheapest-predicted strategy measures within 10% of the measured best."""
    cases: dict[tuple[str, str], list[int]] = {}
    for i, r in enumerate(rows):
        cases.setdefault((r["model"], r["where"]), []).append(i)
    misses = []
    for (model, where), ix in cases.items():
        best = min(rows[i]["seconds"] for i in ix)
        pick = min(ix, key=lambda i: pred[i])
        if rows[pick]["seconds"] > 1.1 * best:
            misses.append(f"{model} {where}: picks {rows[pick]['strategy']} ({best / rows[pick]['seconds']:.2f}x)")
    return len(cases) - len(misses), len(cases), misses


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peak", type=float, default=27e9, help="per-device flop/s (calibrate_cpu.py's matmul rate)")
    ap.add_argument("--free-peak", action="store_true", help="fit the flop rate too")
    ap.add_argument("--results", type=Path, default=RESULTS / "auto_vs_manual.json")
    args = ap.parse_args(argv)
    data = json.loads(args.results.read_text())
    measured = {(r["model"], r["where"], r["strategy"]): r["exec_ms"] for r in data
                if r.get("exec_ms") and r["strategy"] != "auto"}
    print(f"{len(measured)} measured manual strategies from {args.results}", flush=True)
    rows = features(measured)
    peak = None if args.free_peak else args.peak
    coef = fit(rows, peak)
    x = np.array([[r[t] for t in TERMS] for r in rows])
    y = np.array([r["seconds"] for r in rows])
    pred = x @ coef
    lomo = np.zeros(len(rows))
    for name in sorted({r["model"] for r in rows}):
        train = [r for r in rows if r["model"] != name]
        held = [i for i, r in enumerate(rows) if r["model"] == name]
        lomo[held] = (x @ fit(train, peak))[held]
    ok, n, misses = picks(rows, pred)
    ok_l, _, misses_l = picks(rows, lomo)
    inv = [1 / c if c > 0 else math.inf for c in coef]
    lines = ["# `cpu` preset fitted to measured step times", "",
             f"{len(rows)} (model, mesh, manual strategy) step times measured by `auto_vs_manual.py`.", "",
             "| term | fitted | as preset figure |", "|---|---|---|",
             f"| compute | {coef[0]:.3g} s/flop | {inv[0] / 1e9:.1f} GFLOP/s{' (fixed)' if peak else ''} |",
             f"| memory | {coef[1]:.3g} s/byte | {inv[1] / 1e9:.2f} GB/s |",
             f"| collective latency | {coef[2] * 1e3:.3f} ms | alpha |",
             f"| collective bandwidth | {coef[3]:.3g} s/byte | {inv[3] / 1e9:.2f} GB/s |", "",
             f"median |relative error|: {np.median(np.abs(pred / y - 1)):.2f} fitted, "
             f"{np.median(np.abs(lomo / y - 1)):.2f} with each model left out of the fit", "",
             f"cheapest predicted strategy within 10% of the measured best: {ok}/{n} "
             f"(each model left out: {ok_l}/{n})", ""]
    lines += [f"- miss: {m}" for m in misses] + [f"- miss, model left out: {m}" for m in misses_l]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fit_cpu_preset.md").write_text(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(5, 5))
        for strat in sorted({r["strategy"] for r in rows}):
            ix = [i for i, r in enumerate(rows) if r["strategy"] == strat]
            ax.loglog(y[ix] * 1e3, pred[ix] * 1e3, "o", label=strat, alpha=0.7)
        lim = [y.min() * 1e3 * 0.8, y.max() * 1e3 * 1.2]
        ax.plot(lim, lim, "k--", lw=0.8)
        ax.set_xlabel("measured step ms")
        ax.set_ylabel("fitted model ms")
        ax.set_title("cpu preset fit")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(RESULTS / "fit_cpu_preset.png", dpi=110)
    except ImportError:
        print("matplotlib not installed: no plot (pip install .[bench])")
    return 0


if __name__ == "__main__":
    sys.exit(main())
