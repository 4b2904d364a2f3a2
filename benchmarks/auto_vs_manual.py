"""Benchmark: AUTO sharding vs manual strategies (DP, FSDP, Megatron TP, 2D, DCN-DP x ICI-FSDP/TP).

For every model (the project's own: GPT-2 x2 sizes, Llama, wide MLP, ViT; third-party, planned
on the lazy IR as AUTO sees them: HF GPT-2, Llama (GQA), GPT-Neo, BERT, T5, Mixtral and timm
ViT, see :mod:`benchmarks._zoo_cases`) and strategy it reports:

* on the 8 virtual CPU devices (meshes 1x8, 2x4, 4x2, 2 granules x 4): the measured
  steady-state step of the compiled executable (median of calls timed round-robin with
  the case's other strategies, so load on the shared machine hits all of them alike),
  and of the whole lazy step (trace + run); bytes per collective kind read from the partitioned HLO;
  peak bytes per device from the executable's memory analysis;
* the modelled step time (autoshard's cost model, on the ``cpu`` preset for the virtual
  meshes, and on 8x H100, TPU v5e 4x4 and 2 slices of v5e-16 over DCN) and MFU;
* AUTO's solve time, and the plan-quality guard's verdict where AUTO ties a baseline
  (:mod:`autoshard.guard`: what it ties and the ops that forced it).

Writes ``benchmarks/results/auto_vs_manual.md`` (all rows), ``auto_vs_manual_summary.md``
(AUTO against the best manual strategy per case, spliced into README.md by
``--update-readme``) and ``auto_vs_manual_*.png``.

    PYTHONPATH=. python benchmarks/auto_vs_manual.py [--quick] [--update-readme] [--only MODEL[,MESH]] [--group zoo]

``--only gpt2-2L-128,4x2`` measures one case (results go to ``auto_vs_manual_only.*``,
the full tables are left alone); ``--group own`` / ``--group zoo`` runs the project's own
or the third-party models (results in ``auto_vs_manual_<group>.*``).
"""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import argparse
import json
import math
import sys
import time
import traceback
import warnings
from pathlib import Path
from typing import Any

from autoshard.api import axis_kinds, solve
from autoshard.fx_builder import trace_training_step
from benchmarks import _report
from benchmarks._cases import MODELS, ModelCase, real_topologies, virtual_meshes
from benchmarks._hlo_stats import median, time_interleaved
from benchmarks._measure import measure
from benchmarks._strategies import MANUAL, auto_specs, build, manual_specs, modelled, step_flops
from benchmarks._zoo_cases import ZOO_CASES, ir_graph
from mesh import topology_for
from xla_dtensor.spmd import AutoPolicy

RESULTS = Path(__file__).parent / "results"
SOLVE_LIMIT = 60.0


def _trace(case: ModelCase, batch_size: int):
    import torch

    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.ir_graph:
            return ir_graph(case, batch_size)
        return trace_training_step(case.make(), case.batch(batch_size), name=case.name)


def _plan_notes(plan) -> dict:
    """The guard's verdict (where AUTO ties a baseline), the ops that forced it, the largest tensors' layouts."""
    from autoshard.guard import verdict
    from autoshard.spec import spec_str

    guard = plan.stats.get("guard") or {}
    forced = [f"{r['node']} ({r['why']})" for r in (guard.get("forced_by") or [])[:2]]
    whole = [f"{r['op']} x{r['count']}" for r in (guard.get("unsplittable") or [])[:2]]
    params = sorted((k for k, r in plan.roles.items() if r == "param"),
                    key=lambda k: -math.prod(plan.shapes.get(k, ())))[:3]
    return dict(guard=verdict(guard) or "", forced_by="; ".join(forced), unsplittable=", ".join(whole),
                largest=", ".join(f"{k} {spec_str(plan.placements[k])}" for k in params),
                reference=guard.get("reference", ""))


def _solve(graph, mesh_or_none, topo, budget):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = solve(graph, mesh_or_none, topo, memory_budget=budget, time_limit=SOLVE_LIMIT, cache=False)
    return plan, time.perf_counter() - t0


def _strategies(graph, plan, topo, kinds, case: ModelCase) -> dict[str, dict]:
    out = {"auto": auto_specs(plan)}
    for name in MANUAL:
        specs = manual_specs(graph, name, tuple(topo.axis_sizes), kinds, case.tp)
        if specs is not None:
            out[name] = specs
    return out


def run_case(case: ModelCase, graph, where: str, mesh_obj, topo, devices: int, measure_it: bool,
             args: argparse.Namespace, seen: dict) -> list[dict]:
    """All strategies of one (model, mesh/topology) case."""
    budget = float(topo.device.memory_bytes)
    kinds = axis_kinds(mesh_obj, topo)
    plan, solve_s = _solve(graph, mesh_obj, topo, budget)
    model = build(graph, topo, budget)
    flops = step_flops(model)
    rows = []
    for strat, specs in _strategies(graph, plan, topo, kinds, case).items():
        cost, peak, ok = (plan.objective, plan.memory["peak"], plan.memory["peak"] <= budget) if strat == "auto" \
            else modelled(model, specs)
        row = dict(model=case.name, where=where, topology=topo.name, devices=devices, strategy=strat,
                   modelled_ms=cost * 1e3, mfu=flops / (cost * topo.device.peak_flops * devices),
                   modelled_peak_mib=peak / 2**20, budget_mib=budget / 2**20, fits=bool(ok),
                   solve_s=solve_s if strat == "auto" else None, status=plan.status if strat == "auto" else "",
                   **(_plan_notes(plan) if strat == "auto" else {}))
        if measure_it:
            policy = AutoPolicy(memory_budget=budget, time_limit=SOLVE_LIMIT, topology=topo, cache_dir=False)
            row.update(measure(case, mesh_obj, None if strat == "auto" else specs, args.steps, args.reps, seen,
                               f"{where}/{strat}", policy))
        rows.append(row)
        _report.progress(row)
    if measure_it:
        _interleaved(rows, seen, args.reps)
    return rows


def _interleaved(rows: list[dict], seen: dict, reps: int) -> None:
    """Re-time the case's executables round-robin: ``exec_ms`` becomes the paired median.

    The single-layout median right after each compile stays as ``exec_solo_ms``.
    """
    exes = seen.get("executables", {})
    labels = {r["strategy"]: r["same_as"] or r["measured_as"] for r in rows}
    times = time_interleaved({s: exes[lab] for s, lab in labels.items() if lab in exes}, reps)
    for r in rows:
        if r["strategy"] in times:
            r["exec_solo_ms"], r["exec_ms"] = r["exec_ms"], median(times[r["strategy"]]) * 1e3
    print("  interleaved: " + ", ".join(f"{_report.SHORT[r['strategy']]} {r['exec_ms']:.1f}" for r in rows), flush=True)


FAILED: list[str] = []  # "model / case: error" of cases that raised (the run goes on; the report lists them)


def _guarded(case: ModelCase, where: str, fn: Any) -> list[dict]:
    try:
        return fn()
    except Exception as err:  # noqa: BLE001  NOTE: one failing case must not lose an hours-long run; reported
        traceback.print_exc()
        FAILED.append(f"{case.name} / {where}: {type(err).__name__}: {str(err).splitlines()[0][:300]}")
        return []


def run(models: list[ModelCase], mesh_names: list[str], topo_names: list[str], args) -> list[dict]:
    rows: list[dict] = []
    meshes, reals = virtual_meshes(), real_topologies()
    for case in models:
        seen: dict = {}
        graph = _trace(case, case.batch_size)
        for name in (m for m in mesh_names if case.meshes is None or m in case.meshes):
            m = meshes[name]
            rows += _guarded(case, name, lambda: run_case(case, graph, name, m, topology_for(m, "cpu"), 8, True,
                                                          args, seen))
        for name in topo_names:
            topo, n = reals[name]
            g = graph if n * case.per_device == case.batch_size else _trace(case, n * case.per_device)
            rows += _guarded(case, name, lambda: run_case(case, g, name, None, topo, n, False, args, seen))
    return rows


def only(spec: str, models: list[ModelCase], mesh_names: list[str], topo_names: list[str],
         ) -> tuple[list[ModelCase], list[str], list[str]]:
    """The cases ``--only MODEL[,MESH]`` selects (a mesh or a modelled system name; none: all of them).

    Raises:
        ValueError: an unknown model or mesh, naming the allowed ones.
    """
    name, _, where = (part.strip() for part in spec.partition(","))
    picked = [c for c in models if c.name == name]
    if not picked:
        raise ValueError(f"--only: unknown model {name!r}; allowed: {[c.name for c in models]}")
    if not where:
        return picked, mesh_names, topo_names
    if where not in mesh_names + topo_names:
        raise ValueError(f"--only: unknown mesh or system {where!r}; allowed: {mesh_names + topo_names}")
    return picked, [m for m in mesh_names if m == where], [t for t in topo_names if t == where]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one model, mesh 2x4 and one real topology (smoke)")
    ap.add_argument("--update-readme", action="store_true",
                    help="only splice results/auto_vs_manual_summary.md into README.md and exit")
    ap.add_argument("--steps", type=int, default=5, help="timed lazy steps after warm-up")
    ap.add_argument("--reps", type=int, default=15, help="timed calls of the compiled step")
    ap.add_argument("--models", nargs="*", default=None, help=f"subset of {[c.name for c in MODELS + ZOO_CASES]}")
    ap.add_argument("--group", choices=("all", "own", "zoo"), default="all",
                    help="the project's own models, the third-party ones (HF, timm) or both")
    ap.add_argument("--only", default=None, metavar="MODEL[,MESH]",
                    help="one model, and optionally one mesh or modelled system (e.g. gpt2-2L-128,4x2)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.update_readme:
        _report.update_readme(args.out / "auto_vs_manual_summary.md", Path(__file__).parent.parent / "README.md")
        return 0
    pool = {"all": MODELS + ZOO_CASES, "own": MODELS, "zoo": ZOO_CASES}[args.group]
    models = [c for c in pool if args.models is None or c.name in args.models]
    mesh_names, topo_names = list(virtual_meshes()), list(real_topologies())
    if args.quick:
        models, mesh_names, topo_names = models[:1], ["2x4"], topo_names[:1]
        args.steps, args.reps = min(args.steps, 3), min(args.reps, 3)
    if args.only:
        models, mesh_names, topo_names = only(args.only, models, mesh_names, topo_names)
    t0 = time.perf_counter()
    rows = run(models, mesh_names, topo_names, args)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = "_only" if args.only else "_quick" if args.quick else "" if args.group == "all" else f"_{args.group}"
    (args.out / f"auto_vs_manual{suffix}.json").write_text(json.dumps(rows, indent=1, default=str))
    full, summary = _report.full_table(rows), _report.summary_table(rows)
    head = f"Generated by `python benchmarks/auto_vs_manual.py{' --quick' if args.quick else ''}` " \
           f"in {time.perf_counter() - t0:.0f} s.\n\n"
    guard = "\n\n## Plan-quality guard (cases where AUTO is no better than a baseline)\n\n" + _report.guard_table(rows)
    if FAILED:
        guard += "\n\n## Cases that failed\n\n" + "\n".join(f"- {f}" for f in FAILED)
    (args.out / f"auto_vs_manual{suffix}.md").write_text(head + summary + guard + "\n\n## All rows\n\n" + full + "\n")
    if not suffix:
        (args.out / "auto_vs_manual_summary.md").write_text(summary + "\n")
    _report.plots(rows, args.out, suffix)
    print(summary)
    print(f"\nwrote {args.out}/auto_vs_manual{suffix}.md and plots in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
