"""Anytime solve of a compact problem: search for plans, message passing for the bound.

``anytime`` alternates chunks of :func:`autoshard._search.search` (improving plans) with
chunks of :class:`autoshard._lagrange.Dual` (raising the lower bound), so both are
reported as they improve. Whenever the bound has moved, it fixes what no plan cheaper
than the incumbent can use (reduced-cost fixing); if what is left is small enough for
the MIP, the rest of the time goes to solving it exactly, which proves optimality.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from autoshard._cmodel import solve_compact
from autoshard._compact import Compact, Infeasible, from_reduced, objective, plan_of, restrict, x_of
from autoshard._contract import contract
from autoshard._dominance import remove_dominated
from autoshard._lagrange import Dual
from autoshard._memory import MemoryRows
from autoshard._presolve import Reduced
from autoshard._search import search
from autoshard._space import Space

__all__ = ["compact_presolve", "anytime", "AnytimeResult"]


def compact_presolve(red: Reduced, mem: MemoryRows | None, limit: float | None) -> tuple[Compact, dict]:
    """Contract bijections and drop dominated strategies until nothing changes.

    Raises :class:`autoshard._compact.Infeasible` if some node loses every strategy.
    """
    cp = contract(from_reduced(red, mem, limit))
    removed = 0
    while cp.n:
        cp2, nrem = remove_dominated(cp)
        if nrem == 0:
            break
        removed += nrem
        cp = contract(cp2)
    stats = dict(compact_nodes=cp.n, compact_strategies=int(cp.off[-1]), compact_edges=cp.m,
                 compact_entries=int(np.isfinite(cp.W).sum()), dominated=removed,
                 memory_rows=cp.R if cp.limit is not None else 0)
    return cp, stats


@dataclass
class AnytimeResult:
    x: np.ndarray
    objective: float
    bound: float
    optimal: bool
    trace: list[tuple[float, float]]          # (seconds, incumbent)
    bound_trace: list[tuple[float, float]]    # (seconds, bound)
    stats: dict = field(default_factory=dict)


def _fixed_problem(cp: Compact, dual: Dual, incumbent: float) -> Compact | None:
    drop_g, drop_e = dual.fixing(incumbent)
    if not drop_g.any() and not drop_e.any():
        return None
    try:
        return contract(restrict(replace(cp, W=np.where(drop_e, np.inf, cp.W)), ~drop_g))
    except Infeasible:  # nothing cheaper than the incumbent exists
        return replace(cp, n=0)


def anytime(cp: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
            log: Callable[[str], None] | None = None, exact_entries: int = 150_000,
            bound_share: float = 0.25, every: float = 5.0) -> AnytimeResult:
    """Improve ``x0`` (a compact plan that fits memory) and bound the optimum."""
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    sp = Space(cp)
    dual = Dual(sp)
    best_x, best = x0.copy(), objective(cp, x0)
    trace, btrace = [(0.0, best)], []
    stats: dict = dict(search={}, dual_sweeps=0, fixings=0)
    chunk = max(10.0, 0.12 * time_limit)
    optimal, last_fix_bound = False, -math.inf

    def bound_now() -> float:
        return dual.best

    dual.run(min(0.03 * time_limit, 10.0), best)  # first bound and ranking for the kernel moves
    btrace.append((time.perf_counter() - t0, dual.best))
    while time.perf_counter() < deadline - 0.05 and not optimal:
        left = deadline - time.perf_counter()
        res = search(cp, best_x, min(chunk, left), seed=seed + len(trace), log=log,
                     bound=bound_now, every=every, sp=sp,
                     theta=lambda: dual.theta_at_best() if dual.snap is not None else None,
                     stop_at=dual.best + 1e-9 * max(abs(best), 1.0))
        for k, v in res.stats.items():
            if isinstance(v, (int, float)):
                stats["search"][k] = stats["search"].get(k, 0) + v
        base = time.perf_counter() - t0 - res.stats.get("seconds", 0.0)
        for t, obj in res.trace[1:]:
            if obj < best:
                trace.append((base + t, obj))
        if res.objective < best:
            best_x, best = res.x, res.objective
        if res.stats.get("exhausted"):  # an exact sub-solve covered the whole problem
            optimal = True
            break
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        b = dual.run(min(left, chunk * bound_share / (1 - bound_share)), best)
        btrace.append((time.perf_counter() - t0, b))
        if b >= best - 1e-9 * max(abs(best), 1.0):
            optimal = True
            break
        if b > last_fix_bound:
            last_fix_bound = b
            small = _fixed_problem(cp, dual, best)
            stats["fixings"] += 1
            if small is not None and small.n == 0:
                optimal = True  # every cheaper plan was ruled out
                break
            if small is not None and np.isfinite(small.W).sum() <= exact_entries:
                xs = x_of(small, plan_of(cp, best_x))
                if log:
                    log(f"fixing left {small.n} nodes, {int(np.isfinite(small.W).sum())} entries: "
                        f"exact MIP with {deadline - time.perf_counter():.1f}s")
                r = solve_compact(small, deadline - time.perf_counter(), xs)
                if r.x is not None and r.objective < best:
                    best_x = x_of(cp, plan_of(small, r.x))
                    if best_x is None:  # cannot happen: small is a restriction of cp
                        raise AssertionError("fixed problem's plan is not a plan of the full one")
                    best = r.objective
                    trace.append((time.perf_counter() - t0, best))
                if r.optimal:
                    optimal = True
                    btrace.append((time.perf_counter() - t0, best))
                break
    stats["dual_sweeps"] = dual.sweeps
    bound = best if optimal else dual.best
    return AnytimeResult(best_x, best, bound, optimal, trace, btrace, stats)
