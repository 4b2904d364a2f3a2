"""A baseline's free layouts are completed optimally: checked against brute force.

Oracle: :func:`autoshard.solver.brute.brute_force` on the same problem with the pinned nodes
restricted to their pinned strategy (enumeration, no solver).
"""
from __future__ import annotations

import numpy as np

from autoshard.baselines import complete
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.fold import fold_ties
from autoshard.solver.problem import Problem


def _random_problem(rng: np.random.Generator, n: int = 6, k: int = 3, limit: float | None = None) -> Problem:
    costs = [rng.uniform(0, 4, k) for _ in range(n)]
    mems = [rng.uniform(1, 3, k) for _ in range(n)]
    edges = [(v - 1, v) for v in range(1, n)] + [(0, n - 1), (1, 4)]
    mats = [rng.choice([0.0, 1.0, 6.0], size=(k, k)) for _ in edges]
    return Problem("r", costs, mems, [(v, min(n, v + 2)) for v in range(n)], edges, mats, limit)


def _pinned_optimum(p: Problem, pinned: dict[int, int]) -> float:
    costs = [np.where(np.arange(len(c)) == pinned[v], c, np.inf) if v in pinned else c
             for v, c in enumerate(p.node_costs)]
    return brute_force(Problem(p.name, costs, p.node_memory, p.intervals, p.edges, p.edge_costs, p.memory_limit))[0]


def test_pinned_completion_is_the_brute_force_optimum_where_greedy_is_not():
    rng = np.random.default_rng(3)
    greedy_worse = 0
    for _ in range(25):
        p = _random_problem(rng)
        folded = fold_ties(p, [])
        pinned = {0: int(rng.integers(3)), 3: int(rng.integers(3))}
        best = _pinned_optimum(p, pinned)
        got = complete(folded, pinned)
        assert all(got[v] == s for v, s in pinned.items())
        assert abs(evaluate(p, got)[0] - best) < 1e-9
        greedy_worse += evaluate(p, complete(folded, pinned, time_limit=None))[0] > best + 1e-9
    assert greedy_worse > 0  # the instances do tell the two apart


def test_pinned_completion_respects_the_memory_limit():
    rng = np.random.default_rng(5)
    checked = 0
    for _ in range(25):
        p = _random_problem(rng, limit=6.0)
        pinned = {2: int(rng.integers(3))}
        best = _pinned_optimum(p, pinned)
        if not np.isfinite(best):
            continue
        cost, ok, peak = evaluate(p, complete(fold_ties(p, []), pinned))
        assert ok and peak <= 6.0 and abs(cost - best) < 1e-9
        checked += 1
    assert checked > 5
