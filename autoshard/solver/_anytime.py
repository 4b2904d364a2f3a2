"""Anytime solve of a compact problem: search for plans, message passing for the bound.

``anytime`` alternates chunks of :func:`autoshard._search.search` (improving plans) with
chunks of :class:`autoshard._lagrange.Dual` (raising the lower bound), so both are
reported as they improve. Whenever the bound has moved, it fixes what no plan cheaper
than the incumbent can use (reduced-cost fixing); if what is left is small enough for
the MIP, the rest of the time goes to solving it exactly, which proves optimality.
A search run that stalls is replaced by a fresh one from the start plan, and the plans
runs end with are merged (the exact optimum over the strategies they use). While the
bound still rises fast, the dual gets most of the time and its reparametrized costs
pick the strategies of a kernel MIP around the best plan. More runs can go on in
worker processes (:mod:`autoshard._portfolio`), which get the caller's better plans.
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
from autoshard._moves import State, kernel_move, merge, node_moves, pair_moves
from autoshard._presolve import Reduced
from autoshard._search import search
from autoshard._space import Space

__all__ = ["compact_presolve", "anytime", "AnytimeResult"]


def compact_presolve(red: Reduced, mem: MemoryRows | None,
                     limit: float | None) -> tuple[Compact, dict]:
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


def _proved(bound: float, best: float) -> bool:
    """The bound reaches the incumbent (relative tolerance 1e-9)."""
    return bound >= best - 1e-9 * max(abs(best), 1.0)


def anytime(cp: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
            log: Callable[[str], None] | None = None, exact_entries: int = 150_000,
            bound_share: float = 0.15, every: float = 5.0, workers: int = 1,
            restart_after: float | None = None, chunk: float | None = None,
            max_budget: int = 200_000, max_elite: int = 8, hot_share: float | None = None,
            hot_rate: float = 0.02, near_gap: float = 0.03, deep_min: float = 30.0,
            report: Callable[[float, np.ndarray, float], None] | None = None,
            inbox: Callable[[], tuple[float, np.ndarray, float] | None] | None = None,
            ) -> AnytimeResult:
    """Improve ``x0`` (a compact plan that fits memory) and bound the optimum.

    The search runs in chunks of at most 20 s, each continuing the current *run* from
    its best plan; a run that has not improved for ``restart_after`` seconds (default a
    twentieth of the limit, at least 15 s) ends as soon as it has (the search chunk
    returns), and the next one starts again from ``x0`` with new random choices and the
    dual's costs as they are then (the best plan overall is kept). IOPDDL V: runs end in
    a few local optima (1,713,177 most often, 1,617,084 about one in eight), which of
    them depends on the dual's costs more than on the seed, so more runs reach the
    better one.
    A run within ``near_gap`` of the bound is not ended, and the dual is not hot there:
    only polishing gains (IOPDDL M after its kernel jump, 1-1.8% above the bound), and
    each new worker plan is merged with the caller's.
    Every run end joins the ``max_elite`` latest *elite* plans, merged by
    :func:`autoshard._moves.merge`. A dual chunk that closes at least ``hot_rate`` of the
    gap makes the next ones longer (``hot_share`` of the time; default 0.85 with workers,
    who do the searching, else 0.6) and is followed by a kernel move on the best plan
    ranked by the dual's costs (IOPDDL M: 5.19e10 to 4.993e10 in one step once the bound
    passes about 4.91e10). ``workers - 1`` more searches run in subprocesses
    (:class:`autoshard._portfolio.Portfolio`, seeds ``seed + 1009 * i``); the result is
    the best plan and the highest bound of all. ``report(objective, x, bound)`` is called
    at every improvement and bound change (the workers' channel back); ``inbox()`` gives
    the caller's latest plan and bound (the channel in: a worker's run continues from
    the plan when it is better, and the bound tells it when it is near). ``chunk`` and
    ``max_budget`` (largest LNS sub-problem) are for tests; ``stats["run_ends"]`` lists
    the best objective of every run that ended. Near the bound, search chunks make no
    random kicks (``kicks=False``). A best plan within ``near_gap`` of the bound (other
    than the one the last such solve left) has its kernel (2 strategies per node, the
    dual's costs) solved by the MIP itself, with the time left but a tenth of the limit
    when that is at least ``deep_min`` seconds, then node and pair moves: the LP dive
    that made the jump cannot trade memory at the limit (IOPDDL M: the MIP and the
    moves take jump plans 4.99321e10 / 4.99540e10 to 4.99179e10 / 4.99375e10 in 33 / 29 s).
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    peers = None
    if workers > 1 and time_limit > 5.0:
        from autoshard._portfolio import Portfolio
        peers = Portfolio(cp, x0, time_limit - 0.5, [seed + 1009 * i for i in range(1, workers)])
    sp = Space(cp)
    dual = Dual(sp)
    start_obj = objective(cp, x0)
    best_x, best = x0.copy(), start_obj
    trace, btrace = [(0.0, best)], []
    stats: dict = dict(search={}, dual_sweeps=0, fixings=0, runs=1, peer_best=0, run_ends=[],
                       merges=0, merge_better=0, hot_kernels=0, hot_kernel_better=0,
                       peer_merges=0, peer_merge_better=0, deep_kernels=0, deep_kernel_better=0)
    share, hot, polish = bound_share, False, False
    if hot_share is None:  # workers search: this process can give the dual more
        hot_share = 0.85 if workers > 1 else 0.6
    elite: list[np.ndarray] = []
    merge_time = max(2.0, 0.05 * time_limit)
    chunk = min(max(10.0, 0.12 * time_limit), 20.0) if chunk is None else chunk
    restart_after = max(15.0, 0.05 * time_limit) if restart_after is None else restart_after
    optimal, last_fix_bound = False, -math.inf
    run_x, run_obj, run_gain, budget, chunks = best_x, best, t0, 3000, 0
    peer_bound, shared, peer_merged = -math.inf, math.inf, math.nan
    reserve, deep_for = 0.1 * time_limit, math.nan  # deep_for: the plan it left

    def bound_now() -> float:
        return max(dual.best, peer_bound)

    def near(obj: float) -> bool:
        """``obj`` is within ``near_gap`` of the bound: only polishing gains there."""
        return obj - bound_now() <= near_gap * abs(obj)

    def tell() -> None:
        if report is not None:
            report(best, best_x, bound_now())

    def from_peers() -> None:
        """Take the caller's plan (in a worker) or the workers' (in the caller) if better;
        send the caller's best to the workers when theirs is worse."""
        nonlocal best_x, best, peer_bound, run_x, run_obj, run_gain, shared, peer_merged
        got = inbox() if inbox is not None else None
        if got is not None:
            peer_bound = max(peer_bound, got[2])
        if got is not None and got[0] < best:
            best, best_x = got[0], got[1]
            run_x, run_obj, run_gain = best_x, best, time.perf_counter()  # the run goes on from it
            trace.append((time.perf_counter() - t0, best))
            stats["peer_best"] += 1
        if peers is None:
            return
        obj, x, b = peers.best()
        peer_bound = max(peer_bound, b)
        polishing = near(best)
        if (x is not None and polishing and obj != peer_merged
                and deadline - time.perf_counter() > 1.5 and not np.array_equal(x, best_x)):
            # two polishes of one plan near the bound: the union of their strategies
            # often holds the gains of both
            peer_merged = obj
            xm, om = merge(sp, [best_x, x], min(merge_time, deadline - time.perf_counter() - 0.5),
                           seed + 17 * stats["peer_merges"])
            stats["peer_merges"] += 1
            if om < min(best, obj):
                stats["peer_merge_better"] += 1
                x, obj = xm, om
                if log:
                    log(f"merge with a worker's plan: {obj:.10g}")
        if x is not None and obj < best:
            best_x, best = x, obj
            trace.append((time.perf_counter() - t0, best))
            stats["peer_best"] += 1
            if polishing:  # the run goes on from it
                run_x, run_obj, run_gain = best_x, best, time.perf_counter()
        elif best < min(obj, shared):
            peers.share(best, best_x, bound_now())
            shared = best

    def merge_elite(x: np.ndarray) -> None:
        """Add ``x`` to the elite plans and re-solve over the union of their strategies."""
        nonlocal best_x, best
        if not any(np.array_equal(x, e) for e in elite):
            elite.append(x)
        if not any(np.array_equal(best_x, e) for e in elite):
            elite.append(best_x)
        del elite[:-max_elite]
        left = deadline - time.perf_counter()
        if len(elite) < 2 or left < 1.0:
            return
        xm, obj = merge(sp, elite, min(merge_time, left - 0.5), seed + len(elite))
        stats["merges"] += 1
        if obj < best and (sp.limit is None or (sp.usage(xm) <= sp.limit).all()):
            stats["merge_better"] += 1
            best_x, best = xm, obj
            trace.append((time.perf_counter() - t0, best))
            tell()
            if log:
                log(f"merge of {len(elite)} plans: {best:.10g}")

    def adopt(x: np.ndarray, obj: float, what: str) -> None:
        """Take a better plan from a move of this process; the run goes on from it."""
        nonlocal best_x, best, run_x, run_obj, run_gain
        best_x, best = x, obj
        trace.append((time.perf_counter() - t0, best))
        tell()
        if best < run_obj:
            run_x, run_obj, run_gain = best_x, best, time.perf_counter()
        if log:
            log(f"{what}: {best:.10g}")

    def deep_kernel() -> None:
        """The best plan's kernel solved by the MIP with the time left but ``reserve``."""
        nonlocal deep_for
        st = State(sp, best_x)
        secs = deadline - time.perf_counter() - reserve
        if log:
            log(f"near the bound: the kernel by the MIP for {secs:.0f}s")
        gains, _, _ = kernel_move(st, dual.theta_at_best(), 2, secs, seed + 97, exact=True)
        stats["deep_kernels"] += 1
        if gains:
            node_moves(st, deadline)
            pair_moves(st, deadline)
            stats["deep_kernel_better"] += 1
            adopt(st.x, st.obj, "kernel by the MIP")
            from_peers()  # merged with the workers' polish of the same plan
        deep_for = best  # again only for a plan the search or the workers find after it

    dual.run(min(0.03 * time_limit, 10.0), best)  # first bound and ranking for the kernel moves
    btrace.append((time.perf_counter() - t0, dual.best))
    tell()
    while time.perf_counter() < deadline - 0.05 and not optimal:
        left = deadline - time.perf_counter()
        if near(best) and best != deep_for and left - reserve >= deep_min:
            deep_kernel()
            continue
        chunks += 1
        dual_len = min(chunk * share / (1 - share), 1.5 * chunk)  # the dual chunk after it
        search_len = max(2.0, dual_len * (1 - share) / share) if hot and not polish else chunk
        # a run that can still end returns once it has stalled restart_after in all
        near_run = near(run_obj)  # polishing: no kicks, no end
        can_end = not near_run and left > 2 * restart_after
        started = time.perf_counter()
        res = search(cp, run_x, min(search_len, left), seed=seed + 7919 * chunks, log=log,
                     bound=bound_now, every=every, sp=sp, budget=min(budget, max_budget),
                     max_budget=max_budget,
                     theta=lambda: dual.theta_at_best() if dual.snap is not None else None,
                     stop_at=bound_now() + 1e-9 * max(abs(best), 1.0),
                     kicks=not near_run,
                     stall=max(restart_after - (started - run_gain), 1.0) if can_end else math.inf)
        for k, v in res.stats.items():
            if isinstance(v, (int, float)) and k != "budget":
                stats["search"][k] = stats["search"].get(k, 0) + v
        budget = res.stats["budget"]
        base = started - t0
        for t, obj in res.trace[1:]:
            if obj < best:
                trace.append((base + t, obj))
        if res.objective < run_obj:  # dated by its last gain, for the stall rule
            run_x, run_obj, run_gain = res.x, res.objective, started + res.trace[-1][0]
        if res.objective < best:
            best_x, best = res.x, res.objective
            tell()
        if res.stats.get("exhausted"):  # an exact sub-solve covered the whole problem
            optimal = True
            break
        from_peers()
        # a run ends when it stalls, unless it is within near_gap of the bound (IOPDDL M
        # after the kernel on the dual's costs: 1.1-1.8%; a new run from the start plan
        # stalls 8% above the bound)
        if (time.perf_counter() - run_gain > restart_after
                and not near(run_obj)
                and deadline - time.perf_counter() > restart_after):
            stats["runs"] += 1
            stats["run_ends"].append(run_obj)
            if log:
                log(f"run {stats['runs'] - 1} ended at {run_obj:.10g} (no gain for "
                    f"{time.perf_counter() - run_gain:.0f}s): new run from the start plan")
            merge_elite(run_x)
            run_x, run_obj, run_gain, budget = x0.copy(), start_obj, time.perf_counter(), 3000
        left = deadline - time.perf_counter()
        if left <= 0.05:
            break
        b_prev = dual.best
        b = dual.run(min(left, dual_len), best)
        btrace.append((time.perf_counter() - t0, b))
        tell()
        if _proved(bound_now(), best):
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
        # a bound still rising fast (IOPDDL M) earns the dual more time, and its costs
        # re-rank the strategies of the best plan's kernel; within near_gap of the bound
        # only polishing gains, and the search gets the time back
        hot = ((b - b_prev) >= hot_rate * max(best - b_prev, 0.0) and math.isfinite(b_prev)
               and not near(best))
        share = hot_share if hot else bound_share
        if hot and deadline - time.perf_counter() > 1.0:
            st = State(sp, best_x)
            # 2 strategies by score and by the dual's costs: on M, 3-6 give a kernel the
            # MIP does not solve in 30 s, and a kernel stuck at 4 missed the jump (seed 2)
            gains, _, _ = kernel_move(st, dual.theta_at_best(), 2,
                                      min(chunk, deadline - time.perf_counter() - 0.5),
                                      seed + 31 * chunks)
            stats["hot_kernels"] += 1
            polish = False
            if gains:
                node_moves(st, deadline)
                pair_moves(st, deadline)
                # a kernel that moved the plan by 1% or more gets a full search chunk next
                polish = st.obj < (1 - 0.01) * best
                stats["hot_kernel_better"] += 1
                adopt(st.x, st.obj, f"kernel on the dual's costs (bound {b:.10g})")
                if near(best):  # only polishing gains now: the search gets the time back
                    share = bound_share
                from_peers()  # the workers polish it too
    if peers is not None:
        peers.close(wait=0.0 if optimal else deadline - time.perf_counter())
        from_peers()
        stats["peer_errors"], stats["peer_killed"] = peers.errors, peers.killed
    stats["dual_sweeps"] = dual.sweeps
    optimal = optimal or _proved(bound_now(), best)
    bound = best if optimal else bound_now()
    tell()
    return AnytimeResult(best_x, best, bound, optimal, trace, btrace, stats)
