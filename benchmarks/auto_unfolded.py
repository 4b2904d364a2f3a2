"""AUTO on a graph too large for the MIP: GPT-2 48 layers without layer tying.

AUTO ties identical layers (:mod:`autoshard.tying`) so that the MIP stays small (~220
decision nodes for any depth). Without layer ties the folded problem keeps one node per
follower/alias group of every layer, which the MIP does not finish. This script solves
both for the same training step, mesh and memory budget, and prices AUTO's layer-tied
plan on the untied problem (a plan of it: ties only restrict):

1. tied: ``build_model(tie_layers=True)`` folded and solved (what ``solve`` does);
2. untied: ``build_model(tie_layers=False)`` folded, warm-started from plan 1, solved by
   :func:`autoshard.solver.solve_problem` (compact presolve, then the anytime search
   when the compact model is above ``lp_max_edge_vars``);
3. the same untied problem from scratch (no warm start): what the search finds alone.

    PYTHONPATH=. python benchmarks/auto_unfolded.py [--layers 48] [--mesh 2x4]
        [--memory-gib 16] [--time-limit 120]

Prints a table and writes ``benchmarks/results/auto_unfolded.md``.
"""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import argparse
import time
import warnings
from pathlib import Path

from autoshard.build import build_model
from autoshard.solver.evaluate import evaluate
from autoshard.fold import fold_ties
from autoshard.solver import SolverTimeoutWarning, solve_problem
from benchmarks.autoshard_solve import trace_gpt2
from mesh.presets import topology_for

RESULTS = Path(__file__).parent / "results"


def _solve(problem, limit, warm=None):
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeoutWarning)
        sol = solve_problem(problem, limit, warm_start=warm)
    return sol, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=48)
    ap.add_argument("--mesh", default="2x4")
    ap.add_argument("--memory-gib", type=float, default=16.0)
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    graph, trace_s = trace_gpt2(args.layers, 1600, 25)
    shape = tuple(int(x) for x in args.mesh.split("x"))
    m = mesh.Mesh(range(8), shape, ("data", "model"))
    topo = topology_for(m, "tpu-v5e")
    budget = args.memory_gib * 2**30 if args.memory_gib > 0 else None
    rows = []
    tied = build_model(graph, topo, budget, tie_layers=True)
    f_t = fold_ties(tied.problem, tied.ties)
    sol_t, s_t = _solve(f_t.problem, args.time_limit)
    plan = f_t.expand(sol_t.strategies)
    rows.append(("layer-tied (AUTO)", f_t.problem.num_nodes, sol_t, s_t, sol_t.objective))
    untied = build_model(graph, topo, budget, tie_layers=False)
    f_u = fold_ties(untied.problem, untied.ties)
    warm = f_u.fold(plan)
    auto_on_untied, ok, _ = evaluate(f_u.problem, warm)
    assert ok, "the layer-tied plan must be a plan of the untied problem"
    sol_u, s_u = _solve(f_u.problem, args.time_limit, warm)
    rows.append(("untied, search from AUTO's plan", f_u.problem.num_nodes, sol_u, s_u, auto_on_untied))
    sol_s, s_s = _solve(f_u.problem, args.time_limit)
    rows.append(("untied, search from scratch", f_u.problem.num_nodes, sol_s, s_s, auto_on_untied))
    head = ("| problem | folded nodes | compact nodes | compact edge entries | status | objective ms "
            "| bound ms | gap | solve s | AUTO plan on this problem ms | objective / AUTO |\n|"
            + "---|" * 11 + "\n")
    body = "".join(
        f"| {name} | {n:,} | {sol.stats.get('compact_nodes', 0):,} | {sol.stats.get('compact_entries', 0):,} "
        f"| {sol.status.value} | {sol.objective * 1e3:.3f} | {sol.bound * 1e3:.3f} | {sol.gap:.2%} "
        f"| {secs:.1f} | {auto * 1e3:.3f} | {sol.objective / auto:.4f} |\n"
        for name, n, sol, secs, auto in rows)
    text = (f"GPT-2 {args.layers} layers d1600, batch 8x1024, mesh {args.mesh}, tpu-v5e model, memory "
            f"budget {args.memory_gib:g} GiB, time limit {args.time_limit:g} s per solve; trace "
            f"{trace_s:.1f} s, {graph.num_nodes:,} graph nodes.\n\n" + head + body)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "auto_unfolded.md").write_text(text)


if __name__ == "__main__":
    main()
