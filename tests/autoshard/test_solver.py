"""autoshard.solver against the brute-force oracle (autoshard.solver.brute) and hand-computed costs."""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from _iopddl_data import iopddl_file
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.solver.iopddl import read_iopddl
from autoshard.solver.problem import Problem
from autoshard.solver import (InvalidProblemError, MemoryBudgetError, SolveStatus,
                              SolverTimeoutWarning, solve_problem)


def _edge_matrix(rng: np.random.Generator, ku: int, kv: int) -> np.ndarray:
    kind = rng.integers(5)
    if kind == 0:  # all zero: dropped by presolve
        return np.zeros((ku, kv))
    if kind == 1:  # separable a[p] + b[q]: folded into node costs
        return rng.integers(0, 20, ku)[:, None] + rng.integers(0, 20, kv)[None, :].astype(float)
    m = rng.integers(0, 40, (ku, kv)).astype(float)
    m[rng.random((ku, kv)) < 0.15] = math.inf
    return m


def random_problem(seed: int, memory: str) -> Problem:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 7))
    ks = rng.integers(1 if seed % 3 == 0 else 2, 5, n)
    costs = []
    for k in ks:
        c = rng.integers(0, 30, k).astype(float)
        c[rng.random(k) < 0.15] = math.inf
        costs.append(c)
    mem = [rng.integers(0, 10, k).astype(float) for k in ks]
    starts = rng.integers(0, 8, n)
    intervals = [(int(s), int(s + rng.integers(0, 6))) for s in starts]  # some empty
    edges, mats = [], []
    for _ in range(int(rng.integers(n - 1, 2 * n + 1))):
        u, v = (int(x) for x in rng.integers(0, n, 2))
        edges.append((u, v))  # self-loops and parallel/reversed duplicates included
        mats.append(_edge_matrix(rng, ks[u], ks[v]))
    p = Problem(f"rand{seed}", costs, mem, intervals, edges, mats, None)
    if memory == "loose":
        p.memory_limit = 1e9
    elif memory == "tight":
        _, _, min_peak = brute_force(p)
        if math.isfinite(min_peak):
            p.memory_limit = float(min_peak + rng.integers(0, 6))
    elif memory == "too_small":
        p.memory_limit = -1.0
    return p


def _check_against_brute(p: Problem, **kw) -> None:
    best, _, min_peak = brute_force(p)
    if math.isinf(best) and math.isfinite(min_peak):
        with pytest.raises(MemoryBudgetError) as exc:
            solve_problem(p, time_limit=30, **kw)
        assert exc.value.min_peak == pytest.approx(min_peak)
        assert exc.value.proven
        return
    sol = solve_problem(p, time_limit=30, **kw)
    if math.isinf(best):
        assert sol.status == SolveStatus.INFEASIBLE and sol.strategies is None
        return
    assert sol.status == SolveStatus.OPTIMAL
    assert sol.objective == pytest.approx(best, rel=1e-9, abs=1e-9)
    cost, feasible, _ = evaluate(p, sol.strategies)
    assert feasible and cost == pytest.approx(best, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("memory", ["none", "loose", "tight", "too_small"])
@pytest.mark.parametrize("seed", range(25))
def test_random_matches_brute_force(seed: int, memory: str) -> None:
    _check_against_brute(random_problem(seed, memory))


@pytest.mark.parametrize("kw", [dict(memory_form="incremental"), dict(lp_first=True),
                                dict(mip_solver="highs", lp_first=False)])
@pytest.mark.parametrize("seed", range(25, 40))
def test_random_matches_brute_force_variants(seed: int, kw: dict) -> None:
    _check_against_brute(random_problem(seed, "tight"), **kw)


def test_example_optimum_matches_brute_force() -> None:
    p = read_iopddl(iopddl_file("example.json"))
    best, plan, _ = brute_force(p)
    sol = solve_problem(p, time_limit=10)
    assert sol.status == SolveStatus.OPTIMAL
    assert sol.objective == best
    assert evaluate(p, sol.strategies)[:2] == (best, True)


def test_memory_budget_too_small_reports_minimum() -> None:
    p = read_iopddl(iopddl_file("example.json"))
    _, _, min_peak = brute_force(p)
    p.memory_limit = min_peak - 1
    with pytest.raises(MemoryBudgetError) as exc:
        solve_problem(p, time_limit=10)
    assert isinstance(exc.value, ValueError)
    assert exc.value.min_peak == min_peak and exc.value.proven
    assert f"{min_peak:.6g}" in str(exc.value) and str(p.memory_limit)[:2] in str(exc.value)
    assert exc.value.top_nodes  # names the nodes that dominate the peak


def test_infeasible_without_memory_is_a_status() -> None:
    inf = math.inf  # every pair of strategies on the edge is forbidden
    p = Problem("x", [np.array([1.0, 2.0]), np.array([1.0, 1.0])], [np.ones(2)] * 2,
                [(0, 1)] * 2, [(0, 1)], [np.full((2, 2), inf)], 10.0)
    assert brute_force(p)[0] == inf
    assert solve_problem(p).status == SolveStatus.INFEASIBLE


def _hard_problem(seed: int = 7, n: int = 120, k: int = 8, m: int = 360) -> Problem:
    rng = np.random.default_rng(seed)
    edges = [tuple(int(x) for x in rng.choice(n, 2, replace=False)) for _ in range(m)]
    return Problem("hard", [rng.integers(0, 100, k).astype(float) for _ in range(n)],
                   [np.zeros(k)] * n, [(0, 1)] * n, edges,
                   [rng.integers(0, 100, (k, k)).astype(float) for _ in edges], None)


def test_timeout_returns_plan_and_warns() -> None:
    p = _hard_problem()
    with pytest.warns(SolverTimeoutWarning, match="time limit"):
        sol = solve_problem(p, time_limit=2.0)
    assert sol.status == SolveStatus.FEASIBLE and sol.strategies is not None
    cost, feasible, _ = evaluate(p, sol.strategies)
    assert feasible and cost == sol.objective
    assert sol.bound < sol.objective and sol.gap > 0


def test_timeout_falls_back_to_warm_start() -> None:
    p = _hard_problem()
    ws = [0] * p.num_nodes
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sol = solve_problem(p, time_limit=0.05, warm_start=ws)
    assert any(issubclass(w.category, SolverTimeoutWarning) for w in caught)
    assert sol.strategies is not None and sol.objective <= evaluate(p, ws)[0]


def test_warm_start_is_checked() -> None:
    p = read_iopddl(iopddl_file("example.json"))
    with pytest.raises(ValueError, match="node 1: strategy 5 out of range"):
        solve_problem(p, warm_start=[0, 5, 0, 0, 0])


def test_invalid_problem_raises() -> None:
    p = Problem("bad", [np.zeros(2), np.zeros(3)], [np.zeros(2), np.zeros(3)], [(0, 1)] * 2,
                [(0, 1)], [np.zeros((3, 2))], None)
    with pytest.raises(InvalidProblemError, match=r"shape \(3, 2\), expected \(2, 3\)"):
        solve_problem(p)


def test_unknown_backend_is_rejected() -> None:
    p = Problem("t", [np.zeros(2)], [np.zeros(2)], [(0, 1)], [], [], None)
    with pytest.raises(ValueError, match=r"mip_solver='gurobi' is not supported; choose one of"):
        solve_problem(p, mip_solver="gurobi")


@pytest.mark.parametrize("seed", range(40, 70))
def test_random_without_memory_matches_brute_force(seed: int) -> None:
    # seed 53: an inf entry between allowed strategies once passed the separability test
    _check_against_brute(random_problem(seed, "none"))
