"""Solve a strategy-selection :class:`Problem`: presolve, compact problem, then MIP or search.

The model is the marginal-form ILP of ``design/AUTOSHARD.md`` (binary ``s[v,p]``,
continuous edge variables ``e[u,v,p,q]`` tied to ``s`` by ``sum_q e = s_u[p]`` and
``sum_p e = s_v[q]``, one memory row per maximal set of live nodes).

1. Presolve (:mod:`autoshard.solver._presolve`): inf choices removed, single-strategy nodes and
   separable edges folded into costs, parallel edges merged.
2. Compact problem (:mod:`autoshard.solver._anytime`): nodes tied by bijection edges contracted
   (:mod:`autoshard.solver._contract`), dominated strategies removed (:mod:`autoshard.solver._dominance`).
   IOPDDL P: 48,480 free nodes -> 197.
3. A start plan: memory-aware greedy construction (:mod:`autoshard.solver._construct`) and a
   short search.
4. Small compact models (at most ``lp_max_edge_vars`` edge entries): LP relaxation, then
   the MIP with memory rows generated lazily (:mod:`autoshard.solver._cmodel`); a proof of
   optimality or a bound on timeout. Larger ones: the anytime search
   (:mod:`autoshard.solver._search`: node and pair moves, forest DP, LNS with exact sub-MIPs,
   restarts) interleaved with the Lagrangian bound (:mod:`autoshard.solver._lagrange`), whose
   reduced-cost fixing can shrink the problem enough for the exact MIP.

Every returned plan is re-evaluated on the original problem (:func:`autoshard.solver.evaluate.evaluate`).
"""
from __future__ import annotations

import math
import sys
import time
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Sequence

import numpy as np

from autoshard.solver._anytime import anytime
from autoshard.solver._dominance import compact_presolve
from autoshard.solver._cmodel import build_compact_model, solve_compact
from autoshard.solver._compact import Compact, Infeasible, plan_of, x_of
from autoshard.solver._construct import start_plan
from autoshard.solver._lp import LpResult, solve_model
from autoshard.solver._memory_budget import MemoryBudgetError, memory_error
from autoshard.solver._memory import memory_rows
from autoshard.solver._presolve import Flat, InvalidProblemError, flatten, reduce
from autoshard.solver._search import search
from autoshard.solver._space import Space
from autoshard.solver.evaluate import check_strategies, evaluate
from autoshard.solver.problem import Problem

__all__ = ["SolveStatus", "Solution", "MemoryBudgetError", "InvalidProblemError", "SolverError",
           "SolverTimeoutWarning", "solve_problem"]

class SolveStatus(str, Enum):
    OPTIMAL = "OPTIMAL"
    FEASIBLE = "FEASIBLE"                    # time limit hit; ``gap`` says how far from proven
    INFEASIBLE = "INFEASIBLE"                # no plan with finite cost exists
    TIMEOUT_NO_SOLUTION = "TIMEOUT_NO_SOLUTION"


class SolverError(RuntimeError):
    """The OR-tools backend rejected the model or its parameters (a bug, not a user error)."""


def _check_choice(what: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{what}={value!r} is not supported; choose one of {allowed}")


def _checked(res: LpResult) -> LpResult:
    if res.status in ("MODEL_INVALID", "INVALID_SOLVER_PARAMETERS", "SOLVER_TYPE_UNAVAILABLE",
                      "INCOMPATIBLE_OPTIONS", "ABNORMAL"):
        raise SolverError(f"OR-tools returned {res.status}")
    return res


class SolverTimeoutWarning(UserWarning):
    """The time limit stopped the solver before it proved optimality."""


@dataclass(frozen=True, slots=True)
class Solution:
    """A solve's result. ``objective`` is re-evaluated exactly from ``strategies``."""

    status: SolveStatus
    strategies: tuple[int, ...] | None
    objective: float
    bound: float
    gap: float
    solve_time: float
    peak_memory: float
    phase: str                                 # what produced the plan: presolve/lp/mip/warm_start
    stats: dict = field(default_factory=dict, compare=False)


class _Log:
    def __init__(self, verbose: bool, t0: float) -> None:
        self.verbose, self.t0 = verbose, t0

    def __call__(self, msg: str) -> None:
        if self.verbose:
            print(f"[autoshard {time.perf_counter() - self.t0:7.1f}s] {msg}", file=sys.stderr, flush=True)

    def solver_line(self, line: str) -> None:
        for part in line.rstrip().splitlines():
            if part.strip():
                self(f"  | {part}")


def _infeasible(problem: Problem, flat: Flat, budget: float, t0: float, phase: str, stats: dict,
                log: _Log) -> Solution:
    """Raise MemoryBudgetError if memory is the reason, else an INFEASIBLE Solution."""
    if problem.memory_limit is not None:
        err = memory_error(problem, flat, budget, log)
        if err is not None:
            raise err
    log("infeasible: no plan with finite cost exists")
    return _finish(problem, None, SolveStatus.INFEASIBLE, math.inf, t0, phase, stats, log)


def _finish(problem: Problem, plan, status: SolveStatus, bound: float, t0: float, phase: str,
            stats: dict, log: _Log, stacklevel: int = 3) -> Solution:
    if plan is None:
        sol = Solution(status, None, math.inf, bound, math.inf, time.perf_counter() - t0, math.inf,
                       phase, stats)
    else:
        cost, _, peak = evaluate(problem, plan)
        bound = min(bound, cost)
        gap = 0.0 if cost == bound else (cost - bound) / max(abs(cost), 1e-300)
        if gap < 1e-12:  # float noise of the scaled objective
            gap, bound = 0.0, cost
        sol = Solution(status, tuple(int(s) for s in plan), cost, bound, gap,
                       time.perf_counter() - t0, peak, phase, stats)
    log(f"done: {sol.status.value} objective={sol.objective:.10g} bound={sol.bound:.10g} "
        f"gap={sol.gap:.3%} via {phase}")
    if status in (SolveStatus.FEASIBLE, SolveStatus.TIMEOUT_NO_SOLUTION):
        warnings.warn(f"{problem.name!r}: time limit reached, {status.value}: objective "
                      f"{sol.objective:.10g}, bound {sol.bound:.10g}, gap {sol.gap:.3%}",
                      SolverTimeoutWarning, stacklevel=stacklevel)
    return sol


class _Incumbent:
    """The best plan so far in the original problem's terms, and when each was found."""

    def __init__(self, problem: Problem, log: _Log, t0: float) -> None:
        self.problem, self.log, self.t0 = problem, log, t0
        self.plan, self.cost, self.phase = None, math.inf, "warm_start"
        self.trace: list[tuple[float, float]] = []

    def offer(self, name: str, plan, found_at: float | None = None) -> None:
        """Keep ``plan`` if it is feasible and cheaper (``found_at``: when it was found,
        seconds since the start; default now)."""
        if plan is None:
            return
        cost, ok, _ = evaluate(self.problem, plan)
        self.log(f"{name} plan: objective {cost:.10g}{'' if ok else ' (infeasible)'}")
        if ok and cost < self.cost:
            self.plan, self.cost, self.phase = np.asarray(plan), cost, name
            t = time.perf_counter() - self.t0 if found_at is None else found_at
            self.trace.append((t, cost))


def _lp_first(compact: Compact, x0, lp_solver: str, budget: float, log: _Log):
    """LP relaxation of the compact model; an integral plan that fits memory is optimal."""
    rows = None
    if compact.limit is not None and int(np.sum(compact.thi - compact.tlo)) > 300_000:
        rows = np.zeros(0, np.int64)  # lazily generated rows are the MIP's job
    model = build_compact_model(compact, rows)
    res = _checked(solve_model(model, lp_solver, budget, integer=False))
    log(f"LP relaxation ({lp_solver}): {res.status} {res.objective:.10g} in {res.seconds:.1f}s")
    if res.status == "INFEASIBLE":
        return "infeasible", None, -math.inf
    if res.status != "OPTIMAL":
        return "unknown", None, -math.inf
    s = res.x[:int(compact.off[-1])]
    if not np.all(np.minimum(np.abs(s), np.abs(1 - s)) <= 1e-6):
        return "fractional", None, res.objective
    x = np.array([int(np.argmax(s[compact.off[u]:compact.off[u + 1]])) for u in range(compact.n)], np.int64)
    return "integral", x, res.objective


def solve_problem(problem: Problem, time_limit: float = 60.0,
                  warm_start: Sequence[int] | None = None, verbose: bool = False, *,
                  mip_solver: str = "scip", lp_solver: str = "glop", lp_first: bool = False,
                  rel_gap: float = 1e-9, memory_form: str = "auto", heuristic: bool = True,
                  heuristic_time: float | None = None, lp_max_edge_vars: int = 150_000,
                  seed: int = 0, progress_every: float = 5.0, workers: int = 1) -> Solution:
    """Find the cheapest plan of ``problem`` within ``time_limit`` seconds.

    Args:
        problem: the strategy-selection problem.
        time_limit: wall-clock budget for the whole solve (presolve, search, LP, MIP).
        warm_start: a strategy per node (e.g. the best manual baseline): fallback plan,
            and the search's start when no better one is built.
        verbose: progress lines on stderr (every ``progress_every`` seconds during the
            search: incumbent, bound, gap, moves).
        mip_solver: OR-tools backend of the exact MIP, "scip" (default), "highs" or "cp_sat".
        lp_solver: backend of the LP relaxation, "glop" (default) or "pdlp".
        lp_first: solve the LP relaxation first (integral -> certified optimum). Off by
            default: the MIP's root LP is the same LP (IOPDDL B: 16 s of LP, then the
            MIP anyway).
        rel_gap: relative gap at which the MIP stops as OPTIMAL.
        memory_form: memory rows of the MIP, "direct", "incremental" (running sums) or "auto".
        heuristic: build a start plan (greedy + short search) before the MIP; its plan is
            the MIP hint and the fallback on timeout.
        heuristic_time: seconds of search before the MIP (default: a tenth of the limit,
            at most 5 s).
        lp_max_edge_vars: compact models with more finite edge entries than this get
            the anytime search instead of the MIP (IOPDDL V and M).
        seed: seed of the search's random choices (same seed, same sequence of moves).
        progress_every: seconds between progress lines.
        workers: processes for the anytime search of big models (this one and
            ``workers - 1`` independent searches with other seeds, best plan kept); one
            per core is the most that helps. The exact MIP path uses one.

    Returns:
        A :class:`Solution`; ``FEASIBLE`` and ``TIMEOUT_NO_SOLUTION`` also warn
        (:class:`SolverTimeoutWarning`). ``stats["trace"]`` lists (seconds, objective)
        at every improvement, ``stats["bound_trace"]`` the bounds.

    Raises:
        MemoryBudgetError: ``memory_limit`` is below the smallest achievable peak.
        InvalidProblemError: inconsistent problem arrays.

    Example:
        >>> p = Problem("t", [np.array([1.0, 2.0]), np.array([0.0, 0.0])],
        ...             [np.zeros(2), np.zeros(2)], [(0, 1), (0, 1)], [(0, 1)],
        ...             [np.array([[5.0, 0.0], [0.0, 5.0]])], None)
        >>> sol = solve_problem(p)
        >>> sol.status.value, sol.objective, sol.strategies
        ('OPTIMAL', 1.0, (0, 1))
    """
    _check_choice("mip_solver", mip_solver, ("scip", "highs", "cp_sat"))
    _check_choice("lp_solver", lp_solver, ("glop", "pdlp"))
    _check_choice("memory_form", memory_form, ("auto", "direct", "incremental"))
    if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    run = _Run(problem, time_limit, _Log(verbose, time.perf_counter()))
    ws = None if warm_start is None else check_strategies(problem, warm_start)
    compact = run.presolve()
    if isinstance(compact, Solution):
        return compact
    if ws is not None:
        run.inc.offer("warm_start", ws)
    if compact.n == 0:  # everything fixed by presolve
        return run.finish(plan_of(compact, np.zeros(0, np.int64)), SolveStatus.OPTIMAL, -math.inf, "presolve")
    space = Space(compact)
    x0 = start_plan(compact, space) if heuristic else None
    if x0 is not None:
        run.inc.offer("construct", plan_of(compact, x0))
    elif run.inc.plan is not None:
        x0 = x_of(compact, run.inc.plan)  # None if the warm start uses a removed strategy
    if int(np.isfinite(compact.W).sum()) > lp_max_edge_vars and x0 is not None:
        run.log(f"big model ({run.stats['compact_entries']} edge entries > lp_max_edge_vars="
                f"{lp_max_edge_vars}): anytime search")
        bound, proven = run.anytime(compact, x0, seed, progress_every, workers)
    else:
        if x0 is not None and heuristic:
            budget = min(0.1 * run.left(), 5.0) if heuristic_time is None else min(heuristic_time, run.left())
            x0 = search(compact, x0, max(budget, 0.0), seed=seed, space=space).x
            run.inc.offer("search", plan_of(compact, x0))
        exact = run.exact(compact, space, x0, lp_first=lp_first, lp_solver=lp_solver, mip_solver=mip_solver,
                          rel_gap=rel_gap, memory_form=memory_form, seed=seed)
        if isinstance(exact, Solution):
            return exact
        bound, proven = exact
    run.stats["trace"] = run.inc.trace
    if run.inc.plan is None:
        return run.finish(None, SolveStatus.TIMEOUT_NO_SOLUTION, bound, "mip")
    status = SolveStatus.OPTIMAL if proven or run.inc.cost <= bound else SolveStatus.FEASIBLE
    return run.finish(run.inc.plan, status, bound, run.inc.phase)


class _Run:
    """One solve's shared state: the problem, the clock, the log, stats and incumbent."""

    def __init__(self, problem: Problem, time_limit: float, log: _Log) -> None:
        self.problem, self.time_limit, self.log, self.t0 = problem, time_limit, log, log.t0
        self.inc = _Incumbent(problem, log, self.t0)
        self.stats: dict = {}
        self.flat: Flat | None = None

    def left(self) -> float:
        return self.time_limit - (time.perf_counter() - self.t0)

    def finish(self, plan, status: SolveStatus, bound: float, phase: str) -> Solution:  # noqa: ANN001
        return _finish(self.problem, plan, status, bound, self.t0, phase, self.stats, self.log, 4)

    def infeasible(self, phase: str) -> Solution:
        return _infeasible(self.problem, self.flat, max(self.left(), 1.0), self.t0, phase, self.stats,
                           self.log)

    def presolve(self) -> Compact | Solution:
        """Presolve and compact the problem; a Solution when that already decides it."""
        problem = self.problem
        self.flat = flatten(problem)
        red = reduce(self.flat, dedup=False)  # the compact presolve's dominance removes duplicates
        self.stats.update(red.stats)
        if red.empty_nodes.size:
            self.log(f"nodes {red.empty_nodes[:10].tolist()} have no allowed strategy")
            return self.infeasible("presolve")
        limit = problem.memory_limit
        mem = None if limit is None else memory_rows(self.flat, red.allowed, limit)
        if mem is not None and mem.peak_lower_bound > limit * (1 + 1e-12):
            return self.infeasible("presolve")
        try:
            compact, cstats = compact_presolve(red, mem, limit)
        except Infeasible:
            return self.infeasible("presolve")
        self.stats.update(cstats)
        self.log(f"{problem.name}: presolve {self.stats}")
        return compact

    def anytime(self, compact: Compact, x0: np.ndarray, seed: int, every: float,
                workers: int) -> tuple[float, bool]:
        """The anytime search on a big model; returns (bound, proven)."""
        t_any = time.perf_counter() - self.t0
        # the plan's expansion and check, and the workers' exit, come after: IOPDDL M,
        # 0.8 s past a 177.8 s limit without this margin
        limit = max(self.left() - min(0.01 * self.time_limit, 2.0), 0.0)
        res = anytime(compact, x0, limit, seed=seed, log=self.log, every=every, workers=workers)
        inc = self.inc
        for t, o in res.trace[:-1]:  # the search's history; its last entry is the plan itself
            if o < inc.cost and (not inc.trace or o < inc.trace[-1][1]):
                inc.trace.append((t_any + t, o))
        inc.offer("search", plan_of(compact, res.x), t_any + res.trace[-1][0])
        self.stats.update(search=res.stats["search"], dual_sweeps=res.stats["dual_sweeps"])
        self.stats["bound_trace"] = [(t_any + t, b) for t, b in res.bound_trace]
        return res.bound, res.optimal

    def exact(self, compact: Compact, space: Space, x0: np.ndarray | None, *, lp_first: bool, lp_solver: str,
              mip_solver: str, rel_gap: float, memory_form: str, seed: int) -> tuple[float, bool] | Solution:
        """LP relaxation (if asked) and the compact MIP; returns (bound, proven)."""
        bound, log = -math.inf, self.log
        if lp_first and self.left() > 0.1:
            kind, x, lpb = _lp_first(compact, x0, lp_solver, max(0.3 * self.left(), 0.5), log)
            if kind == "infeasible":
                return self.infeasible("lp")
            bound = max(bound, lpb)
            if kind == "integral" and (space.limit is None or (space.usage(x) <= space.limit).all()):
                self.inc.offer("lp", plan_of(compact, x))
                if self.inc.phase == "lp":
                    return self.finish(self.inc.plan, SolveStatus.OPTIMAL, lpb, "lp")
        log(f"MIP ({mip_solver}) with {self.left():.1f}s left")
        r = solve_compact(compact, max(self.left(), 0.1), x0, rel_gap=rel_gap, seed=seed, solver=mip_solver,
                          form=memory_form)
        log(f"MIP: objective {r.objective:.10g} bound {r.bound:.10g} optimal {r.optimal} "
            f"in {r.seconds:.1f}s ({r.solves} solves, {r.rows.size} memory rows)")
        if r.bound == math.inf and self.inc.plan is None:
            return self.infeasible("mip")
        bound = max(bound, r.bound if r.bound != math.inf else -math.inf)
        if r.x is not None:
            self.inc.offer("mip", plan_of(compact, r.x))
        return bound, r.optimal and self.inc.cost <= r.objective + 1e-9 * max(abs(r.objective), 1.0)
