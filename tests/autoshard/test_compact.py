"""The compact problem (contraction, dominance, sub-problems) and the Lagrangian bound,
against the evaluator and exact oracles (brute force / the plain MIP of autoshard.solver._lp)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from _oracle import exact_optimum, tied_problem
from autoshard.solver._dominance import compact_presolve
from autoshard.solver._compact import from_reduced, objective, plan_of, usage, x_of
from autoshard.solver._contract import bijection_edges, contract
from autoshard.solver._lagrange import Dual
from autoshard.solver._memory import memory_rows
from autoshard.solver._neighbourhood import sub_compact
from autoshard.solver._presolve import flatten, reduce
from autoshard.solver._space import RangeMax, Space
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate, memory_profile


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
    from autoshard.solver.problem import Problem
    inf = math.inf
    eye, swap = np.array([[0, inf], [inf, 0]]), np.array([[inf, 0], [0, inf]])
    p = Problem("cyc", [np.zeros(2)] * 3, [np.zeros(2)] * 3, [(0, 1)] * 3, [(0, 1), (1, 2), (0, 2)],
                [eye, eye, swap], None)
    from autoshard.solver._compact import Infeasible
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


def _mplp_by_loops(cp, W, colour, sweeps):
    """MPLP edge updates written per edge and strategy: the oracle for the vectorized
    sweep. Returns each edge's messages (row side, column side) and the bound."""
    theta = [cp.cost[cp.off[u]:cp.off[u + 1]].astype(float) for u in range(cp.n)]
    blocks = [W[cp.ebase[e]:cp.ebase[e + 1]].reshape(cp.k[cp.eu[e]], cp.k[cp.ev[e]])
              for e in range(cp.m)]
    phi = [(np.zeros(b.shape[0]), np.zeros(b.shape[1])) for b in blocks]
    for _ in range(sweeps):
        for col in range(int(colour.max()) + 1):
            for e in np.flatnonzero(colour == col):
                u, v, B = cp.eu[e], cp.ev[e], blocks[e]
                a, b = theta[u] - phi[e][0], theta[v] - phi[e][1]
                new_r = np.array([0.5 * (min(B[p, q] + b[q] for q in range(B.shape[1])) - a[p])
                                  for p in range(B.shape[0])])
                new_c = np.array([0.5 * (min(B[p, q] + a[p] for p in range(B.shape[0])) - b[q])
                                  for q in range(B.shape[1])])
                theta[u] = theta[u] + new_r - phi[e][0]
                theta[v] = theta[v] + new_c - phi[e][1]
                phi[e] = (new_r, new_c)
    bound = cp.const + sum(t.min() for t in theta)
    bound += sum((B - f[0][:, None] - f[1][None, :]).min() for B, f in zip(blocks, phi))
    return phi, bound


@pytest.mark.parametrize("seed", range(3))
def test_vectorized_sweep_equals_per_edge_updates(seed: int) -> None:
    """The sweep's gathered row and column values give the textbook update exactly,
    also with forbidden pairs (every row and column keeps a finite entry)."""
    from dataclasses import replace
    from autoshard.solver._compact import entry_index
    from autoshard.solver._lagrange import _colour_edges
    cp, _ = _compact(tied_problem(seed + 90, n=20), contract_it=False)
    rng = np.random.default_rng(seed)
    e, r, c = entry_index(cp.k, cp.off, cp.eu, cp.ev, cp.ebase)
    r, c = r - cp.off[cp.eu][e], c - cp.off[cp.ev][e]  # strategy within the node
    W = np.where(np.isinf(cp.W), 1e3, cp.W)  # bans only where row and column keep 0
    W = np.where((r > 0) & (c > 0) & (rng.random(r.size) < 0.2), math.inf, W)
    cp = replace(cp, W=W, limit=None)
    d = Dual(Space(cp))
    for _ in range(3):
        d.sweep()
    phi, bound = _mplp_by_loops(cp, W, _colour_edges(cp.n, cp.eu, cp.ev), 3)
    assert np.isinf(W).any() and cp.m > 5
    for e in range(cp.m):
        np.testing.assert_allclose(d.phi_r[d.rb[e]:d.rb[e + 1]], phi[e][0], rtol=1e-12, atol=1e-9)
        np.testing.assert_allclose(d.phi_c[d.cb[e]:d.cb[e + 1]], phi[e][1], rtol=1e-12, atol=1e-9)
    assert d.bound() == pytest.approx(bound, rel=1e-12, abs=1e-9)


def _optimal_plan(p, opt):
    from autoshard.solver import solve_problem
    sol = solve_problem(p, time_limit=30)
    assert sol.objective == pytest.approx(opt, rel=1e-9)
    return np.asarray(sol.strategies)


@pytest.mark.parametrize("seed", range(4))
def test_lp_dive_returns_a_fitting_plan_between_optimum_and_start(seed: int) -> None:
    from autoshard.solver._cmodel import lp_dive
    from autoshard.solver._construct import start_plan
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
