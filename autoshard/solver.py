"""Solve a strategy-selection :class:`Problem` exactly: presolve, LP relaxation, then MIP.

The model is the marginal-form ILP of ``design/AUTOSHARD.md`` (binary ``s[v,p]``,
continuous edge variables ``e[u,v,p,q]`` tied to ``s`` by ``sum_q e = s_u[p]`` and
``sum_p e = s_v[q]``, one memory row per maximal set of live nodes), after the presolve
of :mod:`autoshard._presolve` (inf choices removed, single-strategy nodes and separable
edges folded into costs, parallel edges merged).

Order: the primal heuristic of :mod:`autoshard._heuristic` (a feasible plan in seconds:
MIP hint and timeout fallback); then the LP relaxation (GLOP), whose integral optimum is
a certified optimum. Models above ``lp_max_edge_vars`` edge variables skip LP and MIP
and keep the heuristic's plan (FEASIBLE, trivial bound).
Otherwise a MIP with a warm-start hint and the remaining time. MIP backend finding
(IOPDDL B/G/V, 2 shared cores, see ``benchmarks/iopddl.py``): SCIP is the default; see
the ``mip_solver`` argument for HiGHS and CP-SAT.
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

from autoshard._heuristic import heuristic_plan
from autoshard._lp import LpResult, Model, build_model, solve_model
from autoshard._memory import memory_rows
from autoshard._presolve import Flat, InvalidProblemError, Reduced, flatten, reduce
from autoshard.evaluate import check_strategies, evaluate, memory_profile
from autoshard.problem import Problem

__all__ = ["SolveStatus", "Solution", "MemoryBudgetError", "InvalidProblemError", "SolverError",
           "SolverTimeoutWarning", "solve_problem"]

_PARAMS = {
    "scip": "limits/gap = {gap}\nrandomization/randomseedshift = 0\ndisplay/freq = 1000\n",
    "highs": "mip_rel_gap = {gap}\nthreads = 1\nrandom_seed = 0\n",
    "cp_sat": "relative_gap_limit: {gap} num_workers: 2 random_seed: 0 interleave_search: true",
}


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


class MemoryBudgetError(ValueError):
    """The memory limit is below the smallest peak memory any finite-cost plan needs."""

    def __init__(self, message: str, limit: float, min_peak: float, proven: bool,
                 top_nodes: list[tuple[int, str, float]]) -> None:
        super().__init__(message)
        self.limit, self.min_peak, self.proven, self.top_nodes = limit, min_peak, proven, top_nodes


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


def _plan_from_x(red: Reduced, model: Model, x: np.ndarray) -> np.ndarray:
    f = red.flat
    plan = red.fixed.copy()
    xs, nodes = x[:model.num_s], f.node_of[model.sg]
    order = np.lexsort((-xs, nodes))
    head = np.ones(order.size, bool)
    head[1:] = nodes[order][1:] != nodes[order][:-1]
    pick = model.sg[order[head]]
    plan[f.node_of[pick]] = pick - f.off[f.node_of[pick]]
    return plan


def _is_integral(red: Reduced, model: Model, x: np.ndarray) -> bool:
    xs = x[:model.num_s]
    return bool(np.all(np.minimum(np.abs(xs), np.abs(1 - xs)) <= 1e-6))


def _trivial_bound(red: Reduced) -> float:
    """Constant + each free node's cheapest strategy + each kept edge's cheapest entry."""
    f = red.flat
    free = (red.fixed < 0) & (np.bincount(f.node_of, weights=red.allowed, minlength=f.n) > 0)
    cost = np.where(red.allowed & free[f.node_of], red.cost, np.inf)
    node = np.minimum.reduceat(cost, f.off[:-1])[free] if f.n else np.zeros(0)
    edge = np.full(red.num_edges, np.inf)
    np.minimum.at(edge, red.edge, red.c)
    return red.const + math.fsum(node.tolist()) + math.fsum(edge.tolist())


def _hint(red: Reduced, model: Model, ws: np.ndarray) -> np.ndarray:
    f = red.flat
    choice = f.off[:-1] + ws
    ok = red.allowed[choice]  # nodes whose warm-start strategy survived presolve
    hint = np.full(model.lb.size, np.nan)
    nodes = f.node_of[model.sg]
    hint[:model.num_s] = np.where(ok[nodes], model.sg == choice[nodes], np.nan)
    both = ok[f.node_of[red.A]] & ok[f.node_of[red.B]]
    on = (red.A == choice[f.node_of[red.A]]) & (red.B == choice[f.node_of[red.B]])
    hint[model.num_s:model.num_s + model.num_e] = np.where(both, on, np.nan)
    return hint


def _peak_report(problem: Problem, plan: np.ndarray) -> tuple[float, int, list[tuple[int, str, float]]]:
    prof = memory_profile(problem, plan)
    t = int(np.argmax(prof)) if prof.size else 0
    live = [(v, float(problem.node_memory[v][plan[v]])) for v, (a, b) in enumerate(problem.intervals)
            if a <= t < b]
    live.sort(key=lambda x: -x[1])
    names = problem.node_names
    top = [(v, names[v] if v < len(names) else f"node{v}", m) for v, m in live[:5]]
    return (float(prof.max()) if prof.size else 0.0), t, top


def _memory_error(problem: Problem, flat: Flat, budget: float, log: _Log) -> MemoryBudgetError | None:
    """Min-peak ILP without the limit; None if no finite-cost plan exists at all."""
    red0 = reduce(flat, use_memory_limit=False)
    if red0.empty_nodes.size:
        return None
    mem0 = memory_rows(flat, red0.allowed, None)
    model = build_model(red0, mem0, peak=True)
    log(f"memory limit infeasible; min-peak ILP ({model.lb.size} vars), {budget:.1f}s")
    res = solve_model(model, "scip", budget, integer=True)
    if res.x is None and res.status == "INFEASIBLE":
        return None
    lim = float(problem.memory_limit)
    if res.x is None:
        lb = max(res.bound, mem0.peak_lower_bound)
        msg = (f"memory_limit {lim:.6g} is infeasible: every finite-cost plan needs at least "
               f"{lb:.6g} (lower bound; the min-peak solve found no plan in {budget:.1f}s)")
        return MemoryBudgetError(msg, lim, lb, False, [])
    peak, t, top = _peak_report(problem, _plan_from_x(red0, model, res.x))
    proven = res.status == "OPTIMAL"
    who = ", ".join(f"{name} (#{v}) {m:.4g}" for v, name, m in top)
    msg = (f"memory_limit {lim:.6g} is below the minimum peak memory of any plan: "
           f"{peak:.6g}{'' if proven else f' (best found; lower bound {res.bound:.6g})'}; "
           f"at time {t} it is dominated by {who}")
    return MemoryBudgetError(msg, lim, peak, proven, top)


def _infeasible(problem: Problem, flat: Flat, budget: float, t0: float, phase: str, stats: dict,
                log: _Log) -> Solution:
    """Raise MemoryBudgetError if memory is the reason, else an INFEASIBLE Solution."""
    if problem.memory_limit is not None:
        err = _memory_error(problem, flat, budget, log)
        if err is not None:
            raise err
    log("infeasible: no plan with finite cost exists")
    return _finish(problem, None, SolveStatus.INFEASIBLE, math.inf, t0, phase, stats, log)


def _finish(problem: Problem, plan, status: SolveStatus, bound: float, t0: float, phase: str,
            stats: dict, log: _Log) -> Solution:
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
                      SolverTimeoutWarning, stacklevel=3)
    return sol


def solve_problem(problem: Problem, time_limit: float = 60.0,
                  warm_start: Sequence[int] | None = None, verbose: bool = False, *,
                  mip_solver: str = "scip", lp_solver: str = "glop", lp_first: bool = True,
                  rel_gap: float = 1e-9, memory_form: str = "auto", heuristic: bool = True,
                  heuristic_time: float | None = None, lp_max_edge_vars: int = 250_000) -> Solution:
    """Find the cheapest plan of ``problem`` within ``time_limit`` seconds.

    Args:
        problem: the strategy-selection problem.
        time_limit: wall-clock budget for the whole solve (presolve, LP, MIP).
        warm_start: a strategy per node (e.g. the best manual baseline): MIP hint and fallback.
        verbose: progress lines (elapsed, phase, incumbent, bound) on stderr.
        mip_solver: OR-tools backend, "scip" (default), "highs" or "cp_sat".
        lp_solver: backend of the LP relaxation, "glop" (default) or "pdlp".
        lp_first: solve the LP relaxation first (integral -> certified optimum).
        rel_gap: relative gap at which the MIP stops as OPTIMAL.
        memory_form: "direct", "incremental" (running sums) or "auto".
        heuristic: run the primal heuristic (:mod:`autoshard._heuristic`) first; its plan
            is the MIP hint and the fallback on timeout.
        heuristic_time: its budget in seconds (default: a quarter of the limit, <= 15 s).
        lp_max_edge_vars: above this many edge variables the model is "big": the LP-first
            phase is skipped and, when the heuristic finds a plan, so is the MIP (the
            heuristic gets the time; the bound is then the trivial one).

    Returns:
        A :class:`Solution`; ``FEASIBLE`` and ``TIMEOUT_NO_SOLUTION`` also warn
        (:class:`SolverTimeoutWarning`).

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
    t0 = time.perf_counter()
    log = _Log(verbose, t0)
    left = lambda: time_limit - (time.perf_counter() - t0)  # noqa: E731
    ws = None if warm_start is None else check_strategies(problem, warm_start)
    flat = flatten(problem)
    red = reduce(flat)
    stats = dict(red.stats)
    log(f"{problem.name}: presolve {stats}")
    infeasible = lambda ph: _infeasible(problem, flat, max(left(), 1.0), t0, ph, stats, log)  # noqa: E731
    if red.empty_nodes.size:
        log(f"nodes {red.empty_nodes[:10].tolist()} have no allowed strategy")
        return infeasible("presolve")
    mem = None if problem.memory_limit is None else memory_rows(flat, red.allowed, problem.memory_limit)
    if mem is not None and mem.peak_lower_bound > problem.memory_limit * (1 + 1e-12):
        return infeasible("presolve")
    model = build_model(red, mem, limit=problem.memory_limit, form=memory_form)
    stats.update(vars=int(model.lb.size), rows=int(model.clb.size), nnz=int(model.matrix.nnz),
                 memory_rows=0 if mem is None else mem.num_rows, memory_form=model.memory_form)
    log(f"model: {model.lb.size} vars ({model.num_s} binary), {model.clb.size} rows, "
        f"{model.matrix.nnz} nonzeros, memory {model.memory_form} ({stats['memory_rows']} rows)")
    best_plan, best_cost, phase = None, math.inf, "warm_start"

    def offer(name: str, cand) -> None:
        nonlocal best_plan, best_cost, phase
        if cand is None:
            return
        cost, ok, _ = evaluate(problem, cand)
        log(f"{name} plan: objective {cost:.10g}{'' if ok else ' (infeasible)'}")
        if ok and cost < best_cost:
            best_plan, best_cost, phase = cand, cost, name

    if ws is not None:
        offer("warm_start", ws)
    if model.num_s == 0:  # everything fixed by presolve
        return _finish(problem, red.fixed, SolveStatus.OPTIMAL, -math.inf, t0, "presolve", stats, log)
    big = model.num_e > lp_max_edge_vars
    if heuristic:
        # NOTE: on big models (IOPDDL V/P/M) neither the LP nor the MIP finishes in a
        # minute, and SCIP given a partial hint overran the limit (P: 281 s for 60 s),
        # so there the heuristic gets the whole budget and is the answer.
        default = 0.9 * left() if big else min(0.25 * left(), 15.0)
        budget = default if heuristic_time is None else min(heuristic_time, left())
        plan, hstats = heuristic_plan(red, mem, problem.memory_limit, max(budget, 0.0))
        stats["heuristic"] = {k: v for k, v in hstats.items() if k != "reason"}
        log(f"heuristic: {hstats}")
        offer("heuristic", plan)
    if big and best_plan is not None:
        log(f"big model ({model.num_e} edge vars > lp_max_edge_vars={lp_max_edge_vars}): "
            f"LP and MIP skipped, keeping the {phase} plan")
        return _finish(problem, best_plan, SolveStatus.FEASIBLE, _trivial_bound(red), t0, phase,
                       stats, log)
    bound, lp_x = -math.inf, None
    if lp_first and big:
        log(f"LP-first skipped: {model.num_e} edge vars > lp_max_edge_vars={lp_max_edge_vars}")
    elif lp_first:
        res = _checked(solve_model(model, lp_solver, max(0.3 * left(), 0.5), integer=False,
                                   log=log.solver_line if verbose else None))
        lp_x = res.x
        log(f"LP relaxation ({lp_solver}): {res.status} {res.objective:.10g} in {res.seconds:.1f}s")
        if res.status == "OPTIMAL":
            bound = res.objective
            if _is_integral(red, model, res.x):
                plan = _plan_from_x(red, model, res.x)
                cost, ok, _ = evaluate(problem, plan)
                if ok and cost <= bound + 1e-9 * max(1.0, abs(bound)):
                    return _finish(problem, plan, SolveStatus.OPTIMAL, bound, t0, "lp", stats, log)
        elif res.status == "INFEASIBLE":
            return infeasible("lp")
    if lp_x is not None:
        offer("lp rounding", _plan_from_x(red, model, lp_x))
    # NOTE: OR-tools 9.15's HiGHS interface segfaults on some hinted models (seen on a
    # 7-variable one), so HiGHS gets no hint; the incumbent still backs up its result.
    hint = (None if best_plan is None or mip_solver == "highs"
            else _hint(red, model, np.asarray(best_plan)))
    params = _PARAMS.get(mip_solver, "").format(gap=rel_gap)
    log(f"MIP ({mip_solver}) with {left():.1f}s left" + (f", hint from {phase}" if hint is not None else ""))
    res = _checked(solve_model(model, mip_solver, max(left(), 0.1), integer=True, hint=hint,
                               params=params, log=log.solver_line if verbose else None))
    log(f"MIP: {res.status} objective {res.objective:.10g} bound {res.bound:.10g} in {res.seconds:.1f}s")
    if res.x is not None or res.status == "OPTIMAL":  # else the backend's bound may be a placeholder
        bound = max(bound, res.bound)
    bound = max(bound, _trivial_bound(red))
    if res.x is not None:
        plan = _plan_from_x(red, model, res.x)
        cost, ok, _ = evaluate(problem, plan)
        if ok and cost <= best_cost:
            best_plan, best_cost, phase = plan, cost, "mip"
    if res.status == "INFEASIBLE" and best_plan is None:
        return infeasible("mip")
    if best_plan is None:
        return _finish(problem, None, SolveStatus.TIMEOUT_NO_SOLUTION, bound, t0, "mip", stats, log)
    proven = res.status == "OPTIMAL" and phase == "mip"
    status = SolveStatus.OPTIMAL if proven or best_cost <= bound else SolveStatus.FEASIBLE
    return _finish(problem, best_plan, status, bound, t0, phase, stats, log)
