"""Cost, feasibility and peak memory of a chosen plan, as the IOPDDL reference evaluator.

Semantics (google/iopddl ``iopddl.cc``): the cost is the sum of the chosen node costs
plus, for every edge (u, v), ``edge_costs[k][s_u, s_v]``; node ``v`` holds
``node_memory[v][s_v]`` at every integer time ``t`` with ``start <= t < end`` (the
interval is half-open, so ``start >= end`` is never live); the plan is infeasible when
the total at some time exceeds ``memory_limit`` (strictly greater). An ``inf`` chosen
cost (the contest writes 1e18, see :func:`autoshard.solver.iopddl.read_iopddl`) is infeasible too.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from autoshard.solver.problem import Problem

__all__ = ["evaluate", "memory_profile", "check_strategies"]


def check_strategies(problem: Problem, strategies: Sequence[int]) -> np.ndarray:
    """Return ``strategies`` as an int array after checking its length and ranges.

    Raises:
        ValueError: wrong length or an index outside ``[0, num_strategies(v))``.
    """
    s = np.asarray(strategies, dtype=np.int64).reshape(-1)
    if s.shape[0] != problem.num_nodes:
        raise ValueError(f"need one strategy per node: got {s.shape[0]}, problem "
                         f"{problem.name!r} has {problem.num_nodes} nodes")
    k = np.fromiter((len(c) for c in problem.node_costs), np.int64, problem.num_nodes)
    bad = np.flatnonzero((s < 0) | (s >= k))
    if bad.size:
        v = int(bad[0])
        raise ValueError(f"node {v}: strategy {int(s[v])} out of range, allowed 0..{int(k[v]) - 1}")
    return s


def memory_profile(problem: Problem, strategies: Sequence[int]) -> np.ndarray:
    """Memory in use at every time ``0 .. max(end) - 1`` under ``strategies``.

    Example:
        >>> p = Problem("t", [np.zeros(1)] * 2, [np.array([2.0]), np.array([3.0])],
        ...             [(0, 2), (1, 3)], [], [], None)
        >>> memory_profile(p, [0, 0]).tolist()
        [2.0, 5.0, 3.0]
    """
    s = check_strategies(problem, strategies)
    n = problem.num_nodes
    if n == 0:
        return np.zeros(0)
    iv = np.asarray(problem.intervals, dtype=np.int64).reshape(n, 2)
    mem = np.fromiter((problem.node_memory[v][s[v]] for v in range(n)), np.float64, n)
    live = iv[:, 0] < iv[:, 1]
    horizon = int(iv[live, 1].max()) if live.any() else 0
    lo = np.clip(iv[live, 0], 0, horizon)
    diff = np.zeros(horizon + 1)
    np.add.at(diff, lo, mem[live])
    np.add.at(diff, iv[live, 1], -mem[live])
    return np.cumsum(diff)[:horizon]


def evaluate(problem: Problem, strategies: Sequence[int]) -> tuple[float, bool, float]:
    """Evaluate a plan: ``(cost, feasible, peak_memory)``.

    ``cost`` is summed exactly (``math.fsum``) and is ``inf`` if a chosen cost is;
    ``feasible`` is False on an ``inf`` cost or when memory exceeds the limit.

    Example:
        >>> p = Problem("t", [np.array([1.0, 5.0]), np.array([2.0])],
        ...             [np.array([4.0, 1.0]), np.array([1.0])], [(0, 2), (1, 2)],
        ...             [(0, 1)], [np.array([[10.0], [0.0]])], 3.0)
        >>> evaluate(p, [0, 0])
        (13.0, False, 5.0)
        >>> evaluate(p, [1, 0])
        (7.0, True, 2.0)
    """
    s = check_strategies(problem, strategies)
    terms = [float(problem.node_costs[v][s[v]]) for v in range(problem.num_nodes)]
    for (u, v), c in zip(problem.edges, problem.edge_costs):
        terms.append(float(np.asarray(c)[s[u], s[v]]))
    cost = math.inf if any(math.isinf(t) for t in terms) else math.fsum(terms)
    profile = memory_profile(problem, s)
    peak = float(profile.max()) if profile.size else 0.0
    feasible = math.isfinite(cost) and (
        problem.memory_limit is None or peak <= problem.memory_limit)
    return cost, feasible, peak
