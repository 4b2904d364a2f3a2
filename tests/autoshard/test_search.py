"""The anytime search (autoshard.solver._search, _anytime, _treedp) against exact oracles.

Oracles (tests/autoshard/_oracle.py) share no code with the search: brute force for
tiny problems, else the plain marginal MIP of autoshard.solver._lp solved to optimality.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from _oracle import exact_optimum, tied_problem
from autoshard.solver._dominance import compact_presolve
from autoshard.solver._compact import objective, usage
from autoshard.solver._construct import start_plan
from autoshard.solver._memory import memory_rows
from autoshard.solver._presolve import flatten, reduce
from autoshard.solver._moves import State, pair_moves
from autoshard.solver._search import search
from autoshard.solver._space import Space
from autoshard.solver._treedp import forest_dp, random_forest
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.solver.problem import Problem
from autoshard.solver import SolveStatus, SolverTimeoutWarning, solve_problem
from test_solver import random_problem


def _compact(p: Problem):
    f = flatten(p)
    red = reduce(f, dedup=False)
    mem = None if p.memory_limit is None else memory_rows(f, red.allowed, p.memory_limit)
    return compact_presolve(red, mem, p.memory_limit)[0]


@pytest.mark.parametrize("seed", range(6))
def test_search_reaches_the_optimum_on_small_problems(seed: int) -> None:
    # 20-30 nodes; LNS balls of at most 12 variables (2-3 nodes) never cover the problem
    p = tied_problem(100 + seed, n=20 + 2 * seed)
    opt = exact_optimum(p)
    cp = _compact(p)
    sp = Space(cp)
    x0 = start_plan(cp, sp)
    assert x0 is not None
    res = search(cp, x0, 20.0, budget=12, max_budget=12, stop_at=opt + 1e-9 * abs(opt), seed=seed)
    assert res.objective == pytest.approx(opt, rel=1e-9), res.stats
    assert not res.stats.get("exhausted")
    assert (usage(cp, res.x) <= cp.limit).all()


@pytest.mark.parametrize("seed", range(10))
def test_reported_gap_is_honest(seed: int) -> None:
    # the search path (lp_max_edge_vars=0) with little time: bound <= optimum <= objective
    # (0.5 s: seeds 3 and 7 still stop on the limit)
    p = tied_problem(200 + seed, n=24, memory="tight" if seed % 2 else "none")
    opt = exact_optimum(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeoutWarning)
        sol = solve_problem(p, time_limit=0.5, lp_max_edge_vars=0, seed=seed)
    assert sol.strategies is not None
    cost, ok, _ = evaluate(p, sol.strategies)
    assert ok and cost == sol.objective
    tol = 1e-9 * max(1.0, abs(opt))
    assert sol.bound <= opt + tol <= sol.objective + 2 * tol
    assert sol.objective - opt <= sol.gap * abs(sol.objective) + tol
    if sol.status == SolveStatus.OPTIMAL:
        assert sol.objective == pytest.approx(opt, rel=1e-9)


@pytest.mark.parametrize("seed", range(4))
def test_search_path_proves_small_problems_optimal(seed: int) -> None:
    p = tied_problem(300 + seed, n=16)
    opt = exact_optimum(p)
    sol = solve_problem(p, time_limit=20, lp_max_edge_vars=0)
    assert sol.status == SolveStatus.OPTIMAL and sol.objective == pytest.approx(opt, rel=1e-9)


def test_progress_lines_show_incumbent_and_bound(capsys) -> None:
    p = tied_problem(7, n=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeoutWarning)
        solve_problem(p, time_limit=2.0, lp_max_edge_vars=0, verbose=True, progress_every=0.3)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "incumbent" in ln]
    assert lines and all("bound" in ln and "gap" in ln for ln in lines)


def test_pair_move_finds_a_joint_switch() -> None:
    # u, v agree on strategy 0 (edge free on the diagonal); both prefer 1 but only together
    inf = math.inf
    agree = np.array([[0.0, 50.0], [50.0, 0.0]])
    p = Problem("pair", [np.array([0.0, 0.0]), np.array([10.0, 0.0]), np.array([10.0, 0.0])],
                [np.zeros(2)] * 3, [(0, 1)] * 3, [(1, 2), (0, 1)],
                [agree, np.array([[0.0, 0.0], [inf, 0.0]])], None)
    cp = _compact(p)
    sp = Space(cp)
    st = State(sp, np.zeros(cp.n, np.int64))
    before = st.obj
    assert pair_moves(st, math.inf) > 0
    assert st.obj < before
    assert st.obj == pytest.approx(brute_force(p)[0])


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
    f = flatten(p)
    red = reduce(f, dedup=False)
    from autoshard.solver._compact import from_reduced
    cp = from_reduced(red, None, None)  # no contraction: the tree stays a tree
    sp = Space(cp)
    forest = random_forest(sp, np.random.default_rng(seed), full=True)
    assert forest.non_tree.size == 0
    x = forest_dp(sp, cp.off[:-1], forest) - cp.off[:-1]
    assert objective(cp, x) == pytest.approx(best)


@pytest.mark.parametrize("seed", [2, 5, 7])
def test_search_handles_forbidden_pairs_and_self_loops(seed: int) -> None:
    p = random_problem(seed, "tight")
    best, _, _ = brute_force(p)
    if math.isinf(best):
        pytest.skip("no feasible plan")
    sol = solve_problem(p, time_limit=10, lp_max_edge_vars=0)
    assert sol.objective == pytest.approx(best, rel=1e-9)


def _anytime_case(problem_seed: int, n: int):
    """A tight-memory problem, its exact optimum, compact form and start plan."""
    p = tied_problem(problem_seed, n=n, memory="tight")
    cp = _compact(p)
    x0 = start_plan(cp, Space(cp))
    assert x0 is not None
    return p, exact_optimum(p), cp, x0


@pytest.mark.parametrize("seed", range(3))
def test_binding_takes_every_node_with_a_term_on_the_full_rows(seed: int) -> None:
    from autoshard.solver._neighbourhood import binding, size_of
    _, _, cp, x0 = _anytime_case(420 + seed, 24)
    sp = Space(cp)
    U = usage(cp, x0)
    rng = np.random.default_rng(seed)
    for depth in (0, 2):  # the fullest row alone, then the three fullest
        tol = (cp.limit - np.sort(U)[::-1][depth]) / cp.limit + 1e-12
        full = np.flatnonzero(U >= cp.limit * (1 - tol))
        assert full.size >= depth + 1
        expect = set()
        for g, lo, hi in zip(cp.tg.tolist(), cp.tlo.tolist(), cp.thi.tolist()):
            if any(lo <= r < hi for r in full.tolist()):
                expect.add(int(np.searchsorted(cp.off, g, side="right") - 1))
        got = binding(sp, U, 10**9, rng, tol=tol)
        assert sorted(got.tolist()) == sorted(expect)
        # over budget: a part of them, within the budget
        inS = np.zeros(sp.n, bool)
        inS[got] = True
        small = size_of(sp, got, inS) // 2
        part = binding(sp, U, small, rng, tol=tol)
        assert set(part.tolist()) <= expect and 0 < part.size < len(expect)
        inP = np.zeros(sp.n, bool)
        inP[part] = True
        assert size_of(sp, part, inP) <= small


def test_an_empty_neighbourhood_leaves_the_plan() -> None:
    from autoshard.solver._moves import lns_move
    _, _, cp, x0 = _anytime_case(420, 24)
    st = State(Space(cp), x0)
    assert lns_move(st, np.zeros(0, np.int64), 2.0, 0)[0] is False
    assert np.array_equal(st.x, x0) and st.obj == objective(cp, x0)


@pytest.mark.parametrize("seed", range(2))
def test_restarted_runs_keep_the_best_plan_and_an_honest_gap(seed: int) -> None:
    # LNS of at most 12 variables never covers the problem; a fresh run every 0.3 s chunk (2 s: 14 runs)
    from autoshard.solver._anytime import anytime
    p, opt, cp, x0 = _anytime_case(400 + seed, 26)
    res = anytime(cp, x0, 2.0, seed=seed, restart_after=0.0, chunk=0.3, max_budget=12,
                  exact_entries=0)
    ends = res.stats["run_ends"]
    assert res.stats["runs"] >= 3 and len(ends) == res.stats["runs"] - 1
    assert res.objective <= min(ends, default=math.inf)  # the best run's plan is kept
    assert res.objective == pytest.approx(objective(cp, res.x), rel=1e-12)
    assert (usage(cp, res.x) <= cp.limit).all()
    tol = 1e-9 * max(1.0, abs(opt))
    assert res.bound <= opt + tol <= res.objective + 2 * tol
    assert res.objective - opt <= res.objective - res.bound + tol


def test_search_returns_once_it_has_stalled() -> None:
    # 26 nodes, LNS of at most 12 variables: the search stops improving long before 30 s
    p, opt, cp, x0 = _anytime_case(401, 26)
    res = search(cp, x0, 30.0, budget=12, max_budget=12, seed=0, stall=0.3)
    last_gain = res.trace[-1][0]
    assert res.stats["seconds"] >= last_gain + 0.3   # it waited out the stall ...
    assert res.stats["seconds"] < 15.0                # ... and did not run to the limit
    assert res.objective == pytest.approx(objective(cp, res.x), rel=1e-12)
    assert (usage(cp, res.x) <= cp.limit).all()
    assert res.objective >= opt - 1e-9 * abs(opt)


def test_a_stalled_run_ends_within_its_chunk() -> None:
    # chunks of 3 s but runs that stall after 0.2 s: each run ends as soon as it stalls,
    # so a 5 s solve makes more runs than it has chunks (each run ended with its chunk
    # before: 2 runs at most)
    from autoshard.solver._anytime import anytime
    p, opt, cp, x0 = _anytime_case(400, 26)
    res = anytime(cp, x0, 5.0, seed=0, restart_after=0.2, chunk=3.0, max_budget=12,
                  exact_entries=0)
    assert res.stats["runs"] >= 3, res.stats
    assert len(res.stats["run_ends"]) == res.stats["runs"] - 1
    assert res.objective <= min(res.stats["run_ends"])
    assert (usage(cp, res.x) <= cp.limit).all()
    tol = 1e-9 * max(1.0, abs(opt))
    assert res.bound <= opt + tol <= res.objective + 2 * tol


def test_a_run_near_the_bound_is_not_restarted() -> None:
    # the same stalling runs as above: with every plan counted as near the bound
    # (near_gap 1.0) the first run goes on to the end, and the result is as honest
    from autoshard.solver._anytime import anytime
    p, opt, cp, x0 = _anytime_case(400, 26)
    res = anytime(cp, x0, 2.0, seed=0, restart_after=0.0, chunk=0.3, max_budget=12,
                  exact_entries=0, near_gap=1.0)
    assert res.stats["runs"] == 1 and res.stats["run_ends"] == []
    assert (usage(cp, res.x) <= cp.limit).all()
    tol = 1e-9 * max(1.0, abs(opt))
    assert res.bound <= opt + tol <= res.objective + 2 * tol


def test_worker_processes_return_plans_that_fit_and_cost_what_they_say() -> None:
    from autoshard.solver._portfolio import Portfolio
    p = tied_problem(501, n=30, memory="tight")
    opt = exact_optimum(p)
    cp = _compact(p)
    x0 = start_plan(cp, Space(cp))
    pf = Portfolio(cp, x0, 6.0, seeds=[3, 4])
    pf.close(wait=8.0)
    obj, x, bound = pf.best()
    assert pf.errors == []
    assert x is not None and obj == pytest.approx(objective(cp, x), rel=1e-12)
    assert (usage(cp, x) <= cp.limit).all()
    tol = 1e-9 * max(1.0, abs(opt))
    assert bound <= opt + tol <= obj + 2 * tol


def test_solve_with_two_workers_is_checked_by_the_evaluator() -> None:
    p = tied_problem(502, n=30, memory="tight")
    opt = exact_optimum(p)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SolverTimeoutWarning)
        sol = solve_problem(p, time_limit=8.0, lp_max_edge_vars=0, workers=2, seed=1)
    cost, ok, _ = evaluate(p, sol.strategies)
    assert ok and cost == sol.objective
    tol = 1e-9 * max(1.0, abs(opt))
    assert sol.bound <= opt + tol <= sol.objective + 2 * tol
    with pytest.raises(ValueError, match="workers must be an int >= 1, got 0"):
        solve_problem(p, workers=0)


@pytest.mark.parametrize("seed", range(3))
def test_merge_is_the_best_plan_over_the_union_of_the_elite(seed: int) -> None:
    # oracle: every combination of the strategies the plans use, priced by the evaluator
    import itertools
    from autoshard.solver._compact import plan_of
    from autoshard.solver._moves import merge
    p = tied_problem(600 + seed, n=12, memory="tight")
    cp = _compact(p)
    sp = Space(cp)
    rng = np.random.default_rng(seed)
    plans = []
    for _ in range(5000):
        x = rng.integers(0, cp.k)
        if math.isfinite(objective(cp, x)) and (usage(cp, x) <= cp.limit).all():
            plans.append(x)
        if len(plans) == 3:
            break
    assert len(plans) == 3
    union = [sorted({int(x[u]) for x in plans}) for u in range(cp.n)]
    best = math.inf
    for choice in itertools.product(*union):
        cost, ok, _ = evaluate(p, plan_of(cp, np.array(choice)).tolist())
        if ok:
            best = min(best, cost)
    x, obj = merge(sp, plans, 10.0, seed)
    cost, ok, _ = evaluate(p, plan_of(cp, x).tolist())
    assert ok and cost == pytest.approx(obj, rel=1e-12)
    assert obj == pytest.approx(best, rel=1e-9)
    assert all(u_choice in union[u] for u, u_choice in enumerate(x.tolist()))


@pytest.mark.parametrize("seed", [5, 6])
def test_kernel_on_the_dual_costs_keeps_plans_valid_and_the_gap_honest(seed: int) -> None:
    # hot_rate=0: every dual chunk counts as still rising, so a kernel follows each one
    # (seed 5: one of them improves the plan)
    from autoshard.solver._anytime import anytime
    from autoshard.solver._compact import plan_of
    p, opt, cp, x0 = _anytime_case(700 + seed, 40)
    res = anytime(cp, x0, 3.0, seed=seed, chunk=0.3, max_budget=12, exact_entries=0,
                  hot_rate=0.0)
    assert res.stats["hot_kernels"] >= 1
    cost, ok, _ = evaluate(p, plan_of(cp, res.x).tolist())
    assert ok and cost == pytest.approx(res.objective, rel=1e-12)
    tol = 1e-9 * max(1.0, abs(opt))
    assert res.bound <= opt + tol <= res.objective + 2 * tol


@pytest.mark.parametrize("seed", range(3))
def test_exact_kernel_is_the_best_plan_over_its_strategies(seed: int) -> None:
    # oracle: every combination of the kernel's strategies (each node's current one and
    # its best by score and by the given costs), priced by the evaluator
    import itertools
    from autoshard.solver._compact import plan_of
    from autoshard.solver._moves import best_few, kernel_move
    p = tied_problem(640 + seed, n=12, memory="tight")
    cp = _compact(p)
    sp = Space(cp)
    x0 = start_plan(cp, sp)
    theta = np.random.default_rng(seed).random(int(cp.off[-1]))
    keep = best_few(sp, x0, theta, 1)
    keep[cp.off[:-1] + x0] = True
    choices = [np.flatnonzero(keep[cp.off[u]:cp.off[u + 1]]).tolist() for u in range(cp.n)]
    best = math.inf
    for choice in itertools.product(*choices):
        cost, ok, _ = evaluate(p, plan_of(cp, np.array(choice)).tolist())
        if ok:
            best = min(best, cost)
    st = State(sp, x0)
    better, optimal, _ = kernel_move(st, theta, 1, 10.0, seed, exact=True)
    assert optimal and better == (best < objective(cp, x0))
    cost, ok, _ = evaluate(p, plan_of(cp, st.x).tolist())
    assert ok and cost == pytest.approx(st.obj, rel=1e-12)
    assert st.obj == pytest.approx(best, rel=1e-9)
    assert all(int(st.x[u]) in choices[u] for u in range(cp.n))


def test_near_the_bound_the_kernel_is_solved_by_the_mip() -> None:
    # every plan counts as near the bound (near_gap 1.0): the exact kernel runs at once
    # when its least time allows it, and never in a run shorter than that (30 s: 1 s shows it as well as 3)
    from autoshard.solver._anytime import anytime
    from autoshard.solver._compact import plan_of
    p, opt, cp, x0 = _anytime_case(430, 30)
    tol = 1e-9 * max(1.0, abs(opt))
    for deep_min, runs, limit in ((0.5, True, 3.0), (30.0, False, 1.0)):
        res = anytime(cp, x0, limit, seed=1, chunk=0.3, max_budget=12, exact_entries=0,
                      near_gap=1.0, deep_kernels=((1, 2, deep_min, 30.0), (2, 2, 30.0, 60.0)))
        assert (res.stats["deep_kernels"] >= 1) == runs
        assert res.stats["deep_kernel_better"] <= res.stats["deep_kernels"]
        cost, ok, _ = evaluate(p, plan_of(cp, res.x).tolist())
        assert ok and cost == pytest.approx(res.objective, rel=1e-12)
        assert res.bound <= opt + tol <= res.objective + 2 * tol


def test_workers_stopped_at_close_are_counted_apart_from_failures() -> None:
    # a 60 s search stopped at once: both workers are still running, neither failed
    from autoshard.solver._portfolio import Portfolio
    _, _, cp, x0 = _anytime_case(430, 20)
    pf = Portfolio(cp, x0, 60.0, seeds=[1, 2])
    pf.close(wait=0.0)
    assert pf.killed == 2 and pf.errors == []
    assert all(proc.poll() is not None for proc in pf._procs)


def test_kernel_takes_its_own_count_by_the_dual_costs() -> None:
    # oracle: the mask is each node's best by score given x0 and its 2 lowest theta
    from autoshard.solver._moves import best_few, top_strategies
    p = tied_problem(650, n=12, memory="tight")
    cp = _compact(p)
    sp = Space(cp)
    x0 = start_plan(cp, sp)
    theta = np.random.default_rng(0).random(int(cp.off[-1]))
    keep = best_few(sp, x0, theta, 1, 2)
    for u in range(cp.n):
        lo, hi = int(cp.off[u]), int(cp.off[u + 1])
        want = set(np.argsort(theta[lo:hi], kind="stable")[:2].tolist())
        want |= set(np.flatnonzero(top_strategies(sp, sp.scores(x0), 1)[lo:hi]).tolist())
        assert set(np.flatnonzero(keep[lo:hi]).tolist()) == want
    assert (best_few(sp, x0, theta, 1, 1) == best_few(sp, x0, theta, 1)).all()


def test_first_bound_goes_on_while_it_rises() -> None:
    # a slice closing any part of the gap (first_rate 0) extends the first dual up to
    # first_cap of the limit; first_rate inf keeps the two halves
    from autoshard.solver._anytime import anytime
    _, _, cp, x0 = _anytime_case(430, 30)
    slices = {}
    for rate in (0.0, math.inf):
        res = anytime(cp, x0, 2.0, seed=0, chunk=0.3, max_budget=12, exact_entries=0,
                      first_rate=rate, first_cap=0.3)
        slices[rate] = res.stats.get("first_slices", 0)
    assert slices[math.inf] == 2 and slices[0.0] > 2
