"""Exhaustive search over every plan: the test oracle for :mod:`autoshard.solver`.

Independent of the solver's presolve and model: it enumerates the Cartesian product of
strategies and scores each plan with :func:`autoshard.solver.evaluate.evaluate`'s rules,
vectorized over plans with numpy. Only for tiny problems (``max_plans``).
"""
from __future__ import annotations

import math

import numpy as np

from autoshard.solver.problem import Problem

__all__ = ["brute_force"]


def brute_force(problem: Problem, max_plans: int = 2_000_000,
                ) -> tuple[float, list[int] | None, float]:
    """Best feasible plan by enumeration: ``(cost, strategies, min_peak_memory)``.

    ``cost`` is ``inf`` and ``strategies`` None when no plan is feasible;
    ``min_peak_memory`` is the smallest peak memory over plans with finite cost
    (ignoring the limit; ``inf`` if none), what :class:`MemoryBudgetError` reports.

    Example:
        >>> p = Problem("t", [np.array([1.0, 5.0])], [np.array([4.0, 1.0])], [(0, 1)],
        ...             [], [], 2.0)
        >>> brute_force(p)
        (5.0, [1], 1.0)

    Raises:
        ValueError: more than ``max_plans`` plans.
    """
    ks = [len(c) for c in problem.node_costs]
    total = math.prod(ks)
    if total > max_plans:
        raise ValueError(f"{total} plans to enumerate, more than max_plans={max_plans}")
    n = len(ks)
    if n == 0:
        return 0.0, [], 0.0
    grids = np.meshgrid(*[np.arange(k) for k in ks], indexing="ij")
    plans = np.stack([g.reshape(-1) for g in grids], axis=1)  # (total, n)
    cost = np.zeros(total)
    for v in range(n):
        cost = cost + np.asarray(problem.node_costs[v], np.float64)[plans[:, v]]
    for (u, v), c in zip(problem.edges, problem.edge_costs):
        cost = cost + np.asarray(c, np.float64)[plans[:, u], plans[:, v]]
    times = sorted({t for a, b in problem.intervals for t in range(a, b)})
    peak = np.zeros(total)
    for t in times:
        used = np.zeros(total)
        for v, (a, b) in enumerate(problem.intervals):
            if a <= t < b:
                used = used + np.asarray(problem.node_memory[v], np.float64)[plans[:, v]]
        peak = np.maximum(peak, used)
    finite = np.isfinite(cost)
    min_peak = float(peak[finite].min()) if finite.any() else math.inf
    ok = finite if problem.memory_limit is None else finite & (peak <= problem.memory_limit)
    if not ok.any():
        return math.inf, None, min_peak
    best = int(np.flatnonzero(ok)[np.argmin(cost[ok])])
    return float(cost[best]), plans[best].tolist(), min_peak
