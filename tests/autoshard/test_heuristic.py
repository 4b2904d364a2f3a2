"""The primal heuristic (autoshard._heuristic, _treedp) against the brute-force oracle."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from autoshard._heuristic import _State, heuristic_plan
from autoshard._memory import memory_rows
from autoshard._presolve import flatten, reduce
from autoshard._treedp import forest_dp, random_forest
from autoshard.brute import brute_force
from autoshard.evaluate import evaluate
from autoshard.problem import Problem
from autoshard.solver import SolveStatus, SolverTimeoutWarning, solve_problem
from test_solver import _hard_problem, random_problem


def _heuristic(p: Problem, time_limit: float = 1.0):
    red = reduce(flatten(p))
    if red.empty_nodes.size:
        return None, red
    mem = None if p.memory_limit is None else memory_rows(red.flat, red.allowed, p.memory_limit)
    plan, _ = heuristic_plan(red, mem, p.memory_limit, time_limit)
    return plan, red


@pytest.mark.parametrize("memory", ["none", "tight"])
def test_plans_are_feasible_and_never_beat_brute_force(memory: str) -> None:
    found = feasible_cases = 0
    for seed in range(60):
        p = random_problem(seed, memory)
        best, _, _ = brute_force(p)
        plan, _ = _heuristic(p, 0.2)
        if math.isinf(best):
            if plan is not None:  # no feasible plan exists: the heuristic cannot claim one
                assert not evaluate(p, plan)[1]
            continue
        feasible_cases += 1
        if plan is None:
            continue
        cost, ok, peak = evaluate(p, plan)
        assert ok, (seed, plan, peak, p.memory_limit)
        assert cost >= best - 1e-9 * max(1.0, abs(best))
        found += 1
    assert found >= 0.8 * feasible_cases, (found, feasible_cases)


def _tree_problem(seed: int) -> Problem:
    """A random tree (no cycles), finite costs, no memory limit."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 8))
    ks = rng.integers(2, 4, n)
    edges = [(int(rng.integers(0, v)), v) for v in range(1, n)]
    mats = [rng.integers(0, 50, (ks[u], ks[v])).astype(float) for u, v in edges]
    return Problem(f"tree{seed}", [rng.integers(0, 30, k).astype(float) for k in ks],
                   [np.zeros(k) for k in ks], [(0, 1)] * n, edges, mats, None)


@pytest.mark.parametrize("seed", range(10))
def test_forest_dp_is_exact_on_trees(seed: int) -> None:
    p = _tree_problem(seed)
    best, _, _ = brute_force(p)
    red = reduce(flatten(p))
    st = _State(red, None, None)
    f = red.flat
    forest = random_forest(st, np.random.default_rng(seed), full=True)
    assert forest.non_tree.size == 0
    start = f.off[:-1] + np.maximum(red.fixed, 0)
    for v in np.flatnonzero(red.fixed < 0):  # any allowed start works
        start[v] = f.off[v] + int(np.argmax(red.allowed[f.off[v]:f.off[v + 1]]))
    plan = forest_dp(st, start, forest) - f.off[:-1]
    assert evaluate(p, plan)[0] == pytest.approx(best)


def test_deterministic() -> None:
    p = random_problem(4, "tight")  # small: stops on its own long before the time limit
    a, _ = _heuristic(p, 30.0)
    b, _ = _heuristic(p, 30.0)
    assert a is not None and np.array_equal(a, b)


def test_solver_returns_heuristic_plan_when_mip_has_no_time() -> None:
    p = _hard_problem()
    p.memory_limit = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeoutWarning)
        sol = solve_problem(p, time_limit=1.0, lp_max_edge_vars=0, heuristic_time=0.5)
    assert sol.status == SolveStatus.FEASIBLE and sol.strategies is not None
    cost, ok, _ = evaluate(p, sol.strategies)
    assert ok and cost == sol.objective and sol.bound <= sol.objective
