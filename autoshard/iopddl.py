"""Reader for IOPDDL contest instances (google/iopddl JSON) and a command-line solver.

Format: ``{"problem": {"name", "nodes": {"intervals", "costs", "usages"},
"edges": {"nodes", "costs"}, "usage_limit"}}``; edge cost matrices are row-major
(``p * |S_v| + q``). The contest marks forbidden choices with a cost of 1e18; the
reader turns costs ``>= inf_cost`` into ``inf`` so the solver can remove them.

Usage::

    python -m autoshard.iopddl asplos-2025-iopddl-B.json.gz --time-limit 60
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from autoshard.problem import Problem

__all__ = ["read_iopddl", "IopddlFormatError", "main"]

CONTEST_INF = 1e18


class IopddlFormatError(ValueError):
    """The file is not a well-formed IOPDDL problem."""


def _load_json(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = json.loads(f.read())
    if not isinstance(data, dict) or "problem" not in data:
        raise IopddlFormatError(f"{path}: expected a JSON object with key 'problem', "
                                f"got {type(data).__name__} with keys {list(data)[:5] if isinstance(data, dict) else []}")
    return data["problem"]


def _arrays(rows: list, what: str, inf_cost: float | None) -> list[np.ndarray]:
    out = []
    for i, r in enumerate(rows):
        a = np.asarray(r, dtype=np.float64)
        if a.ndim != 1 or a.size == 0:
            raise IopddlFormatError(f"{what}[{i}] must be a non-empty list of numbers, got {r!r:.80}")
        if inf_cost is not None:
            a[a >= inf_cost] = math.inf
        out.append(a)
    return out


def read_iopddl(path: str | Path, inf_cost: float | None = CONTEST_INF) -> Problem:
    """Read a ``.json`` or ``.json.gz`` IOPDDL instance into a :class:`Problem`.

    Args:
        path: the instance file.
        inf_cost: costs at or above this become ``inf`` (None keeps them).

    Example:
        >>> p = read_iopddl(Path(__file__).parents[1] / ".." / "shared" / "data"
        ...                 / "iopddl" / "example.json")  # doctest: +SKIP
        >>> p.num_nodes, p.memory_limit  # doctest: +SKIP
        (5, 50.0)

    Raises:
        IopddlFormatError: missing keys, inconsistent lengths or bad matrix sizes.
    """
    path = Path(path)
    d = _load_json(path)
    try:
        nodes, edges = d["nodes"], d["edges"]
        intervals_raw, costs_raw, usages_raw = nodes["intervals"], nodes["costs"], nodes["usages"]
        edge_nodes, edge_costs_raw = edges["nodes"], edges["costs"]
    except (KeyError, TypeError) as exc:
        raise IopddlFormatError(f"{path}: missing key {exc} (need nodes.intervals/costs/usages, "
                                f"edges.nodes/costs)") from None
    n = len(costs_raw)
    if len(usages_raw) != n or len(intervals_raw) != n:
        raise IopddlFormatError(f"{path}: {n} cost rows, {len(usages_raw)} usage rows and "
                                f"{len(intervals_raw)} intervals; they must match")
    costs = _arrays(costs_raw, "nodes.costs", inf_cost)
    usages = _arrays(usages_raw, "nodes.usages", None)
    for v in range(n):
        if usages[v].shape != costs[v].shape:
            raise IopddlFormatError(f"node {v}: {costs[v].size} costs but {usages[v].size} usages")
    iv = np.asarray(intervals_raw, dtype=np.int64).reshape(-1, 2) if n else np.zeros((0, 2), np.int64)
    ends = np.asarray(edge_nodes, dtype=np.int64)
    if len(edge_nodes) and (ends.ndim != 2 or ends.shape[1] != 2):
        raise IopddlFormatError(f"{path}: every edge must join exactly two nodes, got shape {ends.shape}")
    if len(edge_costs_raw) != len(edge_nodes):
        raise IopddlFormatError(f"{path}: {len(edge_nodes)} edges but {len(edge_costs_raw)} cost matrices")
    if ends.size and (ends.min() < 0 or ends.max() >= n):
        raise IopddlFormatError(f"{path}: edge endpoint out of range 0..{n - 1}")
    ks = [c.size for c in costs]
    edge_costs = []
    for k, (flat, (u, v)) in enumerate(zip(_arrays(edge_costs_raw, "edges.costs", inf_cost),
                                           ends.tolist())):
        if flat.size != ks[u] * ks[v]:
            raise IopddlFormatError(f"edge {k} ({u}, {v}): {flat.size} costs, expected "
                                    f"{ks[u]} x {ks[v]} = {ks[u] * ks[v]}")
        edge_costs.append(flat.reshape(ks[u], ks[v]))
    limit = d.get("usage_limit")
    return Problem(name=str(d.get("name", path.stem)), node_costs=costs, node_memory=usages,
                   intervals=[(int(a), int(b)) for a, b in iv.tolist()],
                   edges=[(int(u), int(v)) for u, v in ends.tolist()], edge_costs=edge_costs,
                   memory_limit=None if limit is None else float(limit))


def main(argv: list[str] | None = None) -> int:
    """Command line: read an instance, solve it, print objective, bound, gap, time, status."""
    from autoshard.evaluate import evaluate
    from autoshard.solver import solve_problem

    ap = argparse.ArgumentParser(prog="python -m autoshard.iopddl", description=__doc__.split("\n")[0])
    ap.add_argument("file", type=Path)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--solver", default="scip", help="MIP backend: scip (default), highs, cp_sat")
    ap.add_argument("--quiet", action="store_true", help="no progress output")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    problem = read_iopddl(args.file)
    t_read = time.perf_counter() - t0
    print(f"read {problem.name}: {problem.num_nodes} nodes, {len(problem.edges)} edges "
          f"in {t_read:.2f} s", file=sys.stderr)
    sol = solve_problem(problem, time_limit=args.time_limit, verbose=not args.quiet,
                        mip_solver=args.solver)
    cost = feasible = None
    if sol.strategies is not None:
        cost, feasible, _ = evaluate(problem, sol.strategies)
    print(f"instance:  {problem.name}\nstatus:    {sol.status.value}\nobjective: {sol.objective:.10g}"
          f"\nbound:     {sol.bound:.10g}\ngap:       {sol.gap:.3%}\ntime:      {sol.solve_time:.2f} s"
          f"\nevaluated: {cost} (feasible={feasible})")
    return 0 if sol.strategies is not None else 1


if __name__ == "__main__":
    sys.exit(main())
