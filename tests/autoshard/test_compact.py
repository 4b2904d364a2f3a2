"""The compact problem (contraction, dominance, sub-problems) and the Lagrangian bound,
against the evaluator and exact oracles (brute force / the plain MIP of autoshard._lp)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from _oracle import exact_optimum, tied_problem
from autoshard._anytime import compact_presolve
from autoshard._compact import from_reduced, objective, plan_of, usage, x_of
from autoshard._contract import bijection_edges, contract
from autoshard._lagrange import Dual
from autoshard._memory import memory_rows
from autoshard._neighbourhood import sub_compact
from autoshard._presolve import flatten, reduce
from autoshard._space import RangeMax, Space
from autoshard.brute import brute_force
from autoshard.evaluate import evaluate, memory_profile


def _compact(p, contract_it=True):
    f = flatten(p)
    red = reduce(f, dedup=False)
    mem = None if p.memory_limit is None else memory_rows(f, red.allowed, p.memory_limit)
    cp = from_reduced(red, mem, p.memory_limit)
    return (contract(cp) if contract_it else cp), mem


def _random_x(cp, rng):
    return np.array([int(rng.integers(k)) for k in cp.k], np.int64)


@pytest.mark.parametrize("seed", range(8))
def test_contracted_plans_cost_and_weigh_what_the_evaluator_says(seed: int) -> None:
    p = tied_problem(seed, n=14)
    cp, mem = _compact(p)
    assert cp.n < p.num_nodes and not bijection_edges(cp).any()
    rng = np.random.default_rng(seed)
    for _ in range(20):
        x = _random_x(cp, rng)
        plan = plan_of(cp, x)
        cost, _, _ = evaluate(p, plan)
        if math.isfinite(cost):
            assert objective(cp, x) == pytest.approx(cost, rel=1e-12)
        if cp.limit is not None:  # kept rows are the clique times of the original profile
            prof = memory_profile(p, plan)
            assert np.allclose(usage(cp, x), prof[mem.times])
        assert np.array_equal(x_of(cp, plan), x)


@pytest.mark.parametrize("seed", range(8))
def test_compact_presolve_keeps_the_optimum(seed: int) -> None:
    p = tied_problem(seed, n=7)
    best, _, _ = brute_force(p)
    f = flatten(p)
    red = reduce(f, dedup=False)
    mem = memory_rows(f, red.allowed, p.memory_limit)
    cp, stats = compact_presolve(red, mem, p.memory_limit)
    # brute force over the compact plans
    grids = np.meshgrid(*[np.arange(k) for k in cp.k], indexing="ij")
    plans = np.stack([g.reshape(-1) for g in grids], axis=1) if cp.n else np.zeros((1, 0), np.int64)
    costs = [objective(cp, x) for x in plans
             if cp.limit is None or (usage(cp, x) <= cp.limit).all()]
    assert min(costs, default=math.inf) == pytest.approx(best, rel=1e-12)


def test_contraction_forbids_inconsistent_cycles() -> None:
    # three nodes tied in a cycle whose permutations compose to a swap: only strategies
    # fixed by the swap survive (none for k=2: infeasible)
    from autoshard.problem import Problem
    inf = math.inf
    eye, swap = np.array([[0, inf], [inf, 0]]), np.array([[inf, 0], [0, inf]])
    p = Problem("cyc", [np.zeros(2)] * 3, [np.zeros(2)] * 3, [(0, 1)] * 3, [(0, 1), (1, 2), (0, 2)],
                [eye, eye, swap], None)
    from autoshard._compact import Infeasible
    with pytest.raises(Infeasible):
        _compact(p)
    p.edge_costs[2] = eye
    cp, _ = _compact(p)
    assert cp.n == 0 or (cp.n == 1 and cp.k[0] == 2)


@pytest.mark.parametrize("seed", range(6))
def test_sub_problem_prices_moves_exactly(seed: int) -> None:
    p = tied_problem(seed + 20, n=16)
    cp, _ = _compact(p)
    sp = Space(cp)
    rng = np.random.default_rng(seed)
    x = np.array([int(np.argmin(cp.cost[cp.off[u]:cp.off[u + 1]])) for u in range(cp.n)])
    U = sp.usage(x)
    S = np.sort(rng.choice(cp.n, size=max(1, cp.n // 2), replace=False))
    sub = sub_compact(sp, S, x, U, RangeMax(U))
    for _ in range(30):
        y = x.copy()
        y[S] = _random_x(sub, rng)
        d_full = objective(cp, y) - objective(cp, x)
        d_sub = objective(sub, y[S]) - objective(sub, x[S])
        if math.isfinite(d_full):
            assert d_sub == pytest.approx(d_full, rel=1e-9, abs=1e-9)
        if cp.limit is not None and (U <= cp.limit).all():
            fits_full = (sp.usage(y) <= cp.limit).all()
            fits_sub = sub.limit is None or (usage(sub, y[S]) <= sub.limit).all()
            assert fits_full == fits_sub


@pytest.mark.parametrize("seed", range(8))
def test_lagrangian_bound_is_valid_and_fixing_keeps_optimal_plans(seed: int) -> None:
    p = tied_problem(seed + 40, n=24)
    opt = exact_optimum(p)
    assert math.isfinite(opt)
    cp, _ = _compact(p)
    d = Dual(Space(cp))
    for _ in range(40):
        d.sweep()
        d.price_step(d.decode(), opt * 1.5 + 10)
        assert d.bound() <= opt + 1e-6 * max(1.0, abs(opt))
    assert d.best > -math.inf
    # every strategy and entry of an optimal plan survives fixing at incumbent = optimum
    model_plan = _optimal_plan(p, opt)
    drop_g, drop_e = d.fixing(opt)
    x = x_of(cp, model_plan)
    assert not drop_g[cp.off[:-1] + x].any()
    assert not drop_e[cp.ebase[:-1] + x[cp.eu] * cp.k[cp.ev] + x[cp.ev]].any()


def _optimal_plan(p, opt):
    from autoshard.solver import solve_problem
    sol = solve_problem(p, time_limit=30)
    assert sol.objective == pytest.approx(opt, rel=1e-9)
    return np.asarray(sol.strategies)


@pytest.mark.parametrize("seed", range(4))
def test_lp_dive_returns_a_fitting_plan_between_optimum_and_start(seed: int) -> None:
    from autoshard._cmodel import lp_dive
    from autoshard._construct import start_plan
    p = tied_problem(60 + seed, n=24)
    opt = exact_optimum(p)
    cp, _ = _compact(p)
    sp = Space(cp)
    x0 = start_plan(cp, sp)
    assert x0 is not None
    r = lp_dive(cp, 20.0, x0)
    assert (usage(cp, r.x) <= cp.limit).all()
    assert opt - 1e-9 * abs(opt) <= r.objective <= objective(cp, x0)
    assert r.objective == pytest.approx(objective(cp, r.x))
