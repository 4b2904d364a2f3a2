"""Solve the public IOPDDL contest instances and report objective, bound, gap, status, time.

Usage::

    PYTHONPATH=. python benchmarks/iopddl.py --instances B,G,V --time-limit 60 \
        [--solvers scip,highs] [--data DIR] [--out benchmarks/results]

Prints a markdown table (one row per instance and MIP backend), writes it to
``<out>/iopddl.md`` and a bar plot (solve time and gap) to ``<out>/iopddl.png``.
Times are wall-clock on whatever machine runs it; on a shared machine they are pessimistic.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

_REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_REPO))

from autoshard.evaluate import evaluate  # noqa: E402
from autoshard.iopddl import read_iopddl  # noqa: E402
from autoshard.solver import solve_problem  # noqa: E402


def _data_dir(arg: str | None) -> Path:
    roots = ([Path(arg)] if arg else []) + [_REPO / ".." / "shared" / "data" / "iopddl"]
    if os.environ.get("XLA_DTENSOR_SHARED"):
        roots.append(Path(os.environ["XLA_DTENSOR_SHARED"]) / "data" / "iopddl")
    roots.append(Path("/work/shared/data/iopddl"))
    for r in roots:
        if (r / "example.json").exists():
            return r.resolve()
    sys.exit(f"IOPDDL data not found in {[str(r) for r in roots]}; pass --data")


def _row(path: Path, solver: str, limit: float, verbose: bool) -> dict:
    t0 = time.perf_counter()
    problem = read_iopddl(path)
    t_read = time.perf_counter() - t0
    print(f"[bench] {path.name}: read in {t_read:.1f}s, solving with {solver} "
          f"(limit {limit:.0f}s)", file=sys.stderr, flush=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sol = solve_problem(problem, time_limit=limit, verbose=verbose, mip_solver=solver)
    ok = sol.strategies is not None and evaluate(problem, sol.strategies)[1]
    print(f"[bench] {path.name}: {sol.status.value} objective {sol.objective:.10g} "
          f"bound {sol.bound:.10g} in {sol.solve_time:.1f}s", file=sys.stderr, flush=True)
    return dict(instance=problem.name, solver=solver, nodes=problem.num_nodes,
                edges=len(problem.edges), status=sol.status.value, objective=sol.objective,
                bound=sol.bound, gap=sol.gap, time=sol.solve_time, read=t_read, via=sol.phase,
                evaluated_feasible=ok, edge_vars=sol.stats.get("edge_vars", 0),
                memory_form=sol.stats.get("memory_form", ""))


def _table(rows: list[dict], limit: float) -> str:
    head = ("| instance | solver | nodes | edges | edge vars | status | objective | bound | gap "
            "| solve s | read s | plan from | checked |\n|" + "---|" * 13 + "\n")
    body = "".join(
        f"| {r['instance']} | {r['solver']} | {r['nodes']:,} | {r['edges']:,} | {r['edge_vars']:,} "
        f"| {r['status']} | {r['objective']:.10g} | {r['bound']:.10g} | {r['gap']:.3%} "
        f"| {r['time']:.1f} | {r['read']:.1f} | {r['via']} | {'yes' if r['evaluated_feasible'] else 'NO'} |\n"
        for r in rows)
    return head + body + f"\nTime limit {limit:.0f} s per solve; wall-clock on a shared machine.\n"


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['instance'].split('-')[-1]}\n{r['solver']}" for r in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(max(6, 1.3 * len(rows) + 3), 4))
    a.bar(labels, [r["time"] for r in rows], color=["tab:green" if r["status"] == "OPTIMAL"
                                                    else "tab:orange" for r in rows])
    a.set_ylabel("solve time [s] (green: proven optimal)")
    b.bar(labels, [100 * r["gap"] if r["gap"] != float("inf") else 0 for r in rows])
    for i, r in enumerate(rows):
        if r["gap"] == float("inf"):
            b.text(i, 0, "no plan", ha="center", va="bottom", rotation=90)
    b.set_ylabel("gap to best bound [%]")
    fig.suptitle("IOPDDL contest instances: autoshard.solver")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--instances", default="B,G,V", help="comma list of B,G,V,P,M")
    ap.add_argument("--solvers", default="scip", help="comma list of scip,highs,cp_sat")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--data", default=None)
    ap.add_argument("--out", type=Path, default=_REPO / "benchmarks" / "results")
    ap.add_argument("--verbose", action="store_true", help="solver progress lines")
    args = ap.parse_args(argv)
    data = _data_dir(args.data)
    rows = []
    for inst in args.instances.split(","):
        for solver in args.solvers.split(","):
            rows.append(_row(data / f"asplos-2025-iopddl-{inst.strip()}.json.gz", solver.strip(),
                             args.time_limit, args.verbose))
    table = _table(rows, args.time_limit)
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "iopddl.md").write_text(table)
    _plot(rows, args.out / "iopddl.png")
    print(f"wrote {args.out / 'iopddl.md'} and {args.out / 'iopddl.png'}", file=sys.stderr)


if __name__ == "__main__":
    main()
