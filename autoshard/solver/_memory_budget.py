"""Why a memory limit cannot be met: the smallest peak any plan needs, and who holds it.

:func:`memory_error` solves the min-peak ILP (no limit) and builds the
:class:`MemoryBudgetError` that :func:`autoshard.solver.solve_problem` raises.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from autoshard.solver._lp import Model, build_model, solve_model
from autoshard.solver._memory import memory_rows
from autoshard.solver._presolve import Flat, Reduced, reduce
from autoshard.solver.evaluate import memory_profile
from autoshard.solver.problem import Problem

__all__ = ["MemoryBudgetError", "memory_error"]


class MemoryBudgetError(ValueError):
    """The memory limit is below the smallest peak memory any finite-cost plan needs."""

    def __init__(self, message: str, limit: float, min_peak: float, proven: bool,
                 top_nodes: list[tuple[int, str, float]]) -> None:
        super().__init__(message)
        self.limit, self.min_peak, self.proven, self.top_nodes = limit, min_peak, proven, top_nodes



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


def _peak_report(problem: Problem, plan: np.ndarray) -> tuple[float, int, list[tuple[int, str, float]]]:
    prof = memory_profile(problem, plan)
    t = int(np.argmax(prof)) if prof.size else 0
    live = [(v, float(problem.node_memory[v][plan[v]])) for v, (a, b) in enumerate(problem.intervals)
            if a <= t < b]
    live.sort(key=lambda x: -x[1])
    names = problem.node_names
    top = [(v, names[v] if v < len(names) else f"node{v}", m) for v, m in live[:5]]
    return (float(prof.max()) if prof.size else 0.0), t, top


def memory_error(problem: Problem, flat: Flat, budget: float, log: Callable[[str], None]) -> MemoryBudgetError | None:
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
