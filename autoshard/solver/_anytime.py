"""Anytime solve of a compact problem: search for plans, message passing for the bound.

:class:`AnytimeSearch` alternates chunks of :func:`autoshard.solver._search.search`
(improving plans) with chunks of :class:`autoshard.solver._lagrange.Dual` (raising the
lower bound), so both are reported as they improve. Whenever the bound has moved, it
fixes what no plan cheaper than the incumbent can use (reduced-cost fixing); if what is
left is small enough for the MIP, the rest of the time goes to solving it exactly,
which proves optimality. A search *run* that stalls is replaced by a fresh one from the
start plan, and the plans runs end with are merged (the exact optimum over the
strategies they use). While the bound still rises fast the dual gets most of the time,
and its reparametrized costs pick the strategies of a kernel MIP around the best plan.
More runs go on in worker processes (:mod:`autoshard.solver._portfolio`), which get the
caller's better plans. Every tuned number is a field of :class:`AnytimeSettings`
(:mod:`autoshard.solver._anytime_settings`); how they were measured is in
docs/autoshard.md ("Runs and workers").

Example:
    >>> result = AnytimeSearch(compact, start, 30.0, seed=1).run()  # doctest: +SKIP
    >>> result.objective >= result.bound  # doctest: +SKIP
    True
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from autoshard.solver._cmodel import solve_compact
from autoshard.solver._anytime_settings import AnytimeResult, AnytimeSettings
from autoshard.solver._compact import Compact, Infeasible, objective, plan_of, restrict, x_of
from autoshard.solver._contract import contract
from autoshard.solver._lagrange import Dual
from autoshard.solver._moves import State, kernel_move, merge, node_moves, pair_moves
from autoshard.solver._peers import PeerExchange
from autoshard.solver._search import search
from autoshard.solver._space import Space

__all__ = ["AnytimeSearch", "AnytimeSettings", "AnytimeResult", "anytime"]

Report = Callable[[float, np.ndarray, float], None]
Inbox = Callable[[], "tuple[float, np.ndarray, float] | None"]


@dataclass
class _Run:
    """The current search run: its best plan, when that was found and its LNS size."""

    x: np.ndarray
    objective: float
    gained_at: float
    budget: int


def proved(bound: float, best: float) -> bool:
    """The bound reaches the incumbent (relative tolerance 1e-9)."""
    return bound >= best - 1e-9 * max(abs(best), 1.0)


def _fixed_problem(compact: Compact, dual: Dual, incumbent: float) -> Compact | None:
    """The problem without what reduced-cost fixing rules out; None if nothing is."""
    drop_strategies, drop_entries = dual.fixing(incumbent)
    if not drop_strategies.any() and not drop_entries.any():
        return None
    try:
        costs = np.where(drop_entries, np.inf, compact.W)
        return contract(restrict(replace(compact, W=costs), ~drop_strategies))
    except Infeasible:  # nothing cheaper than the incumbent exists
        return replace(compact, n=0)


class AnytimeSearch:
    """Improve ``start`` (a compact plan that fits memory) and bound the optimum within
    ``time_limit`` seconds.

    ``workers - 1`` more searches run in subprocesses (seeds ``seed + 1009 i``); the
    result is the best plan and the highest bound of all. ``report(objective, x, bound)``
    is called at every improvement and bound change (a worker's channel back);
    ``inbox()`` gives the caller's latest (objective, plan, bound) (a worker's channel in).
    """

    def __init__(self, compact: Compact, start: np.ndarray, time_limit: float, *,
                 settings: AnytimeSettings = AnytimeSettings(), seed: int = 0, workers: int = 1,
                 log: Callable[[str], None] | None = None, report: Report | None = None,
                 inbox: Inbox | None = None) -> None:
        s = settings
        if s.hot_share is None:  # workers search: this process can give the dual more
            s = replace(s, hot_share=0.85 if workers > 1 else 0.6)
        if s.first_dual_share is None:
            s = replace(s, first_dual_share=0.2 if workers > 1 else 0.03)
        if s.first_dual_max is None:
            s = replace(s, first_dual_max=20.0 if workers > 1 else 10.0)
        if s.chunk is None:
            s = replace(s, chunk=min(max(s.chunk_range[0], s.chunk_share * time_limit), s.chunk_range[1]))
        if s.restart_after is None:
            s = replace(s, restart_after=max(s.restart_min, s.restart_share * time_limit))
        self.settings, self.seed, self.log, self.report = s, seed, log, report
        self.compact, self.start, self.time_limit = compact, start, time_limit
        self.t0 = time.perf_counter()
        self.deadline = self.t0 + time_limit
        self.space = Space(compact)
        self.dual = Dual(self.space, s.dual_alpha, s.dual_target_gap)
        self.start_objective = objective(compact, start)
        self.best_x, self.best = start.copy(), self.start_objective
        self.run_state = self._new_run(self.best_x, self.best)
        self.trace, self.bound_trace = [(0.0, self.best)], []
        self.stats: dict = dict(search={}, dual_sweeps=0, fixings=0, runs=1, peer_best=0, run_ends=[],
                                merges=0, merge_better=0, hot_kernels=0, hot_kernel_better=0,
                                peer_merges=0, peer_merge_better=0, deep_kernels=0,
                                deep_kernel_better=0)
        self.elite: list[np.ndarray] = []
        self.share, self.hot, self.polish, self.optimal = s.bound_share, False, False, False
        self.chunks, self.last_fix_bound = 0, -math.inf
        self.deep_for, self.deep_step = math.nan, 0  # the plan the last deep kernel had, the next kernel
        self.peers = PeerExchange(self, compact, start, workers, inbox)

    # -- small queries --------------------------------------------------------------
    def left(self) -> float:
        return self.deadline - time.perf_counter()

    def bound_now(self) -> float:
        return max(self.dual.best, self.peers.bound)

    def near(self, obj: float) -> bool:
        """``obj`` is within ``near_gap`` of the bound: only polishing gains there."""
        return obj - self.bound_now() <= self.settings.near_gap * abs(obj)

    def tell(self) -> None:
        if self.report is not None:
            self.report(self.best, self.best_x, self.bound_now())

    def say(self, msg: str) -> None:
        if self.log:
            self.log(msg)

    def _new_run(self, x: np.ndarray, obj: float) -> _Run:
        return _Run(x, obj, time.perf_counter(), self.settings.run_budget)

    def improve(self, x: np.ndarray, obj: float, *, run_goes_on: bool) -> None:
        """Take a better plan (dated now); the current run continues from it if asked."""
        self.best_x, self.best = x, obj
        self.trace.append((time.perf_counter() - self.t0, obj))
        if run_goes_on:
            self.run_state = _Run(x, obj, time.perf_counter(), self.run_state.budget)

    def adopt(self, x: np.ndarray, obj: float, what: str) -> None:
        """Take a better plan from a move of this process; the run goes on from it."""
        self.improve(x, obj, run_goes_on=obj < self.run_state.objective)
        self.tell()
        self.say(f"{what}: {obj:.10g}")

    # -- the loop ---------------------------------------------------------------------
    def run(self) -> AnytimeResult:
        s = self.settings
        self._first_dual(min(s.first_dual_share * self.time_limit, s.first_dual_max))
        reserve = s.reserve_share * self.time_limit
        while self.left() > 0.05 and not self.optimal:
            kernel = self._deep_next() if self.near(self.best) else None
            if kernel is not None and self.left() - reserve >= kernel[2]:
                self._deep_kernel(kernel, min(self.left() - reserve, kernel[3]))
                continue
            if self._search_chunk():
                break
            self.peers.exchange()
            self._maybe_end_run()
            if self.left() <= 0.05 or self._dual_chunk():
                break
        return self._finish()

    def _first_dual(self, seconds: float) -> None:
        """The first bound, in slices of half ``seconds``: while one still closes
        ``first_rate`` of the gap (M), the dual goes on (up to ``first_cap`` of the limit)
        and the kernel follows at once; V's bound has settled after two slices."""
        s, piece = self.settings, seconds / 2
        before = self.dual.run(piece, self.best)
        bound = self.dual.run(piece, self.best)
        self.peers.exchange()  # the workers' plans give the gap its scale
        slices, cap = 2, min(s.first_cap * self.time_limit, s.first_cap_max)
        while ((slices + 1) * piece <= cap and math.isfinite(before)
               and not proved(bound, self.best)
               and bound - before >= s.first_rate * max(self.best - before, 0.0)):
            before, bound = bound, self.dual.run(piece, self.best)
            slices += 1
            self.peers.exchange()
        self.bound_trace.append((time.perf_counter() - self.t0, bound))
        self.tell()
        self.stats["first_slices"] = slices
        self.say(f"first bound {bound:.10g} after {slices} slices of {piece:.1f}s")
        self._set_hot(before, bound)
        if slices > 2 and not self.near(self.best):
            self._hot_kernel(bound)

    def _set_hot(self, before: float, bound: float) -> None:
        """The dual is hot when its last chunk closed ``hot_rate`` of the gap (not near it)."""
        s = self.settings
        self.hot = (bound - before >= s.hot_rate * max(self.best - before, 0.0)
                    and math.isfinite(before) and not self.near(self.best))
        self.share = s.hot_share if self.hot else s.bound_share

    def _chunk_lengths(self) -> tuple[float, float]:
        """(search, dual) seconds of the next chunk pair."""
        s = self.settings
        dual_len = min(s.chunk * self.share / (1 - self.share), 1.5 * s.chunk)
        hot_search = min(max(2.0, dual_len * (1 - self.share) / self.share), s.chunk)
        return (hot_search if self.hot and not self.polish else s.chunk), dual_len

    def _search_chunk(self) -> bool:
        """Continue the current run for a chunk; True if it proved the plan optimal."""
        s, run = self.settings, self.run_state
        self.chunks += 1
        near_run = self.near(run.objective)  # polishing: no kicks, no end
        can_end = not near_run and self.left() > 2 * s.restart_after
        started = time.perf_counter()
        dual = self.dual
        res = search(self.compact, run.x, min(self._chunk_lengths()[0], self.left()),
                     seed=self.seed + s.chunk_seed_stride * self.chunks, log=self.log,
                     bound=self.bound_now, every=s.every, space=self.space,
                     budget=min(run.budget, s.max_budget), max_budget=s.max_budget,
                     theta=lambda: dual.theta_at_best() if dual.snap is not None else None,
                     stop_at=self.bound_now() + 1e-9 * max(abs(self.best), 1.0), kicks=not near_run,
                     stall=max(s.restart_after - (started - run.gained_at), 1.0) if can_end else math.inf)
        for k, v in res.stats.items():
            if isinstance(v, (int, float)) and k != "budget":
                self.stats["search"][k] = self.stats["search"].get(k, 0) + v
        run.budget = res.stats["budget"]
        self.trace.extend((started - self.t0 + t, obj) for t, obj in res.trace[1:] if obj < self.best)
        if res.objective < run.objective:  # dated by its last gain, for the stall rule
            self.run_state = _Run(res.x, res.objective, started + res.trace[-1][0], run.budget)
        if res.objective < self.best:
            self.best_x, self.best = res.x, res.objective
            self.tell()
        self.optimal = bool(res.stats.get("exhausted"))  # a sub-solve covered the whole problem
        return self.optimal

    def _maybe_end_run(self) -> None:
        """End a run that has stalled ``restart_after`` (unless near the bound: M after
        its kernel jump is 1.1-1.8% above it, a new run from the start plan 8%)."""
        s, run = self.settings, self.run_state
        stalled = time.perf_counter() - run.gained_at
        if stalled <= s.restart_after or self.near(run.objective) or self.left() <= s.restart_after:
            return
        self.stats["runs"] += 1
        self.stats["run_ends"].append(run.objective)
        self.say(f"run {self.stats['runs'] - 1} ended at {run.objective:.10g} (no gain for "
                 f"{stalled:.0f}s): new run from the start plan")
        self._merge_elite(run.x)
        self.run_state = self._new_run(self.start.copy(), self.start_objective)

    def _dual_chunk(self) -> bool:
        """Raise the bound for a chunk, fix, and re-rank; True when the solve is over."""
        before = self.dual.best
        bound = self.dual.run(min(self.left(), self._chunk_lengths()[1]), self.best)
        self.bound_trace.append((time.perf_counter() - self.t0, bound))
        self.tell()
        if proved(self.bound_now(), self.best):
            self.optimal = True
            return True
        if bound > self.last_fix_bound:
            self.last_fix_bound = bound
            if self._fix_and_solve():
                return True
        # a bound still rising fast (M) earns the dual more time and re-ranks the kernel
        self._set_hot(before, bound)
        if self.hot and self.left() > 1.0:
            self._hot_kernel(bound)
        return False

    def _fix_and_solve(self) -> bool:
        """Reduced-cost fixing; a small enough rest goes to the exact MIP for the time
        left. True when that ends the solve."""
        small = _fixed_problem(self.compact, self.dual, self.best)
        self.stats["fixings"] += 1
        if small is not None and small.n == 0:
            self.optimal = True  # every cheaper plan was ruled out
            return True
        entries = 0 if small is None else int(np.isfinite(small.W).sum())
        if small is None or entries > self.settings.exact_entries:
            return False
        self.say(f"fixing left {small.n} nodes, {entries} entries: exact MIP with {self.left():.1f}s")
        res = solve_compact(small, self.left(), x_of(small, plan_of(self.compact, self.best_x)))
        if res.x is not None and res.objective < self.best:
            x = x_of(self.compact, plan_of(small, res.x))
            if x is None:  # cannot happen: small is a restriction of the problem
                raise AssertionError("fixed problem's plan is not a plan of the full one")
            self.improve(x, res.objective, run_goes_on=False)
        if res.optimal:
            self.optimal = True
            self.bound_trace.append((time.perf_counter() - self.t0, self.best))
        return True

    def _hot_kernel(self, bound: float) -> None:
        """The best plan's kernel on the dual's costs (M: 5.19e10 to 4.993e10 in one step
        once the bound passes about 4.91e10), then node and pair moves."""
        s = self.settings
        state = State(self.space, self.best_x)
        gains, _, _ = kernel_move(state, self.dual.theta_at_best(), s.kernel_strategies,
                                  min(s.chunk, self.left() - 0.5),
                                  self.seed + s.kernel_seed_stride * self.chunks)
        self.stats["hot_kernels"] += 1
        self.polish = False
        if not gains:
            return
        node_moves(state, self.deadline)
        pair_moves(state, self.deadline)
        # a full search chunk only for a jump that lands near the bound: one that does not
        # (M's kernels before the bound is strong) is followed by the next dual chunk
        self.polish = state.obj < (1 - s.polish_jump) * self.best and self.near(state.obj)
        self.stats["hot_kernel_better"] += 1
        self.adopt(state.x, state.obj, f"kernel on the dual's costs (bound {bound:.10g})")
        if self.near(self.best):  # only polishing gains now: the search gets the time back
            self.share = s.bound_share
        self.peers.exchange()  # the workers polish it too

    def _deep_next(self) -> tuple[int, int, float, float] | None:
        """The next kernel by the MIP for the best plan (the first for a new plan)."""
        if self.best != self.deep_for:
            self.deep_for, self.deep_step = self.best, 0
        kernels = self.settings.deep_kernels
        return kernels[self.deep_step] if self.deep_step < len(kernels) else None

    def _deep_kernel(self, kernel: tuple[int, int, float, float], seconds: float) -> None:
        """The best plan's kernel solved by the MIP (the LP dive that made M's jump
        cannot trade memory at the limit: 4.99291e10 to 4.99169e10 in 10 s)."""
        state, step = State(self.space, self.best_x), self.deep_step
        self.say(f"near the bound: the kernel by the MIP ({kernel[0]} + {kernel[1]}) for {seconds:.0f}s")
        gains, _, _ = kernel_move(state, self.dual.theta_at_best(), kernel[0], seconds,
                                  self.seed + self.settings.deep_seed_offset, exact=True,
                                  c_theta=kernel[1])
        self.stats["deep_kernels"] += 1
        if gains:
            node_moves(state, self.deadline)
            pair_moves(state, self.deadline)
            self.stats["deep_kernel_better"] += 1
            self.adopt(state.x, state.obj, "kernel by the MIP")
            self.peers.exchange()  # merged with the workers' polish of the same plan
        self.deep_for, self.deep_step = self.best, step + 1  # its plan: only the later kernels

    def _merge_elite(self, x: np.ndarray) -> None:
        """Add ``x`` and the best plan to the elite and re-solve over their strategies."""
        for plan in (x, self.best_x):
            if not any(np.array_equal(plan, e) for e in self.elite):
                self.elite.append(plan)
        del self.elite[:-self.settings.max_elite]
        if len(self.elite) < 2 or self.left() < 1.0:
            return
        merged, obj = merge(self.space, self.elite, min(self.merge_time(), self.left() - 0.5),
                            self.seed + len(self.elite))
        self.stats["merges"] += 1
        limit = self.space.limit
        if obj < self.best and (limit is None or (self.space.usage(merged) <= limit).all()):
            self.stats["merge_better"] += 1
            self.improve(merged, obj, run_goes_on=False)
            self.tell()
            self.say(f"merge of {len(self.elite)} plans: {self.best:.10g}")

    def merge_time(self) -> float:
        return max(self.settings.merge_min, self.settings.merge_share * self.time_limit)

    def _finish(self) -> AnytimeResult:
        self.peers.close(0.0 if self.optimal else self.left())
        self.stats["dual_sweeps"] = self.dual.sweeps
        self.optimal = self.optimal or proved(self.bound_now(), self.best)
        bound = self.best if self.optimal else self.bound_now()
        self.tell()
        return AnytimeResult(self.best_x, self.best, bound, self.optimal, self.trace,
                             self.bound_trace, self.stats)


def anytime(compact: Compact, start: np.ndarray, time_limit: float, *, seed: int = 0,
            workers: int = 1, log: Callable[[str], None] | None = None, report: Report | None = None,
            inbox: Inbox | None = None, **settings: object) -> AnytimeResult:
    """:class:`AnytimeSearch` with the :class:`AnytimeSettings` fields given by keyword."""
    return AnytimeSearch(compact, start, time_limit, settings=AnytimeSettings(**settings), seed=seed,
                         workers=workers, log=log, report=report, inbox=inbox).run()
