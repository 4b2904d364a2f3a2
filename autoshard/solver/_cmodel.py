"""The marginal-form MIP of a :class:`~autoshard.solver._compact.Compact` problem, with memory
rows added lazily.

Same model as :mod:`autoshard.solver._lp` (binary ``s`` per strategy, continuous ``e`` per
finite edge entry tied by marginal rows) over the compact problem. Memory rows are
generated: solve with a subset of the kept rows, add the rows the plan overflows (the
worst ones, at most ``batch``), repeat. Every model solved is a relaxation of the full
one, so a backend bound is a valid lower bound throughout; a plan that fits every row is
returned as soon as it is found. IOPDDL P: 58,316 kept rows, of which a few dozen bind.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from autoshard.solver._compact import Compact, entry_index, objective, restrict, usage
from autoshard.solver._lp import Model, _memory, _Rows, solve_model
from autoshard.solver._memory import MemoryRows

__all__ = ["build_compact_model", "solve_compact", "lp_dive", "CompactResult", "FAILED"]

# memory rows are scaled by the limit: feastol 1e-9 keeps a plan's overflow below 1e-9 of it
_SCIP = ("limits/gap = {gap}\nrandomization/randomseedshift = {seed}\ndisplay/freq = 1000\n"
         "numerics/feastol = 1e-9\n")
# NOTE: the LP relaxation of these models is integral or nearly so (measured on LNS
# sub-problems of IOPDDL M: LP optimum = MIP optimum); SCIP's presolve and cut rounds then
# cost 5-20x the LP itself (0.22 s instead of 1.18 s for 7,600 edge variables). Whole
# compact problems too: IOPDDL B proved optimal in 14 s without them, 61 s with them
# (same machine and load).
# NOTE: with a hint, SCIP 9 (OR-tools 9.15) fails ("invalid SCIP status", UNKNOWN_STATUS)
# when both presolving and root separation are off; root separation stays on.
_SCIP_LEAN = "presolving/maxrounds = 0\nseparating/maxrounds = 0\n"


FAILED = ("UNKNOWN_STATUS", "ABNORMAL", "MODEL_INVALID", "INVALID_SOLVER_PARAMETERS",
          "SOLVER_TYPE_UNAVAILABLE", "INCOMPATIBLE_OPTIONS")


@dataclass(frozen=True, slots=True)
class CompactResult:
    x: np.ndarray | None      # best plan found that fits every row (or None)
    objective: float
    bound: float              # valid lower bound (-inf if none)
    optimal: bool             # the plan is proven optimal (within rel_gap)
    status: str               # the last backend status (ABNORMAL etc. mean a failed solve)
    rows: np.ndarray          # memory rows in the last model
    solves: int
    seconds: float


def _rows_subset(compact: Compact, rows: np.ndarray) -> MemoryRows:
    """The memory terms restricted to kept rows ``rows`` (sorted), re-indexed 0..len-1."""
    lo, hi = np.searchsorted(rows, compact.tlo), np.searchsorted(rows, compact.thi)
    t = lo < hi
    z = np.zeros(0)
    return MemoryRows(rows, compact.base[rows], compact.tg[t], compact.tcoef[t], lo[t], hi[t], z, 0.0)


def build_compact_model(compact: Compact, rows: np.ndarray | None = None, form: str = "auto") -> Model:
    """The MIP of ``compact`` with memory rows ``rows`` (all kept rows if None)."""
    G = int(compact.off[-1])
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    fin = np.flatnonzero(np.isfinite(compact.W))
    e, r, c, w = e[fin], r[fin], c[fin], compact.W[fin]
    acc = _Rows()
    first = acc.new(compact.n, 1.0, 1.0)
    acc.add(first + compact.node_of, np.arange(G), 1.0)
    evar = G + np.arange(fin.size)
    for side in (r, c):
        key, inv = np.unique(e * G + side, return_inverse=True)
        f0 = acc.new(key.size, 0.0, 0.0)
        acc.add(f0 + inv, evar, 1.0)
        acc.add(f0 + np.arange(key.size), key % G, -1.0)
    nvar, nm, mform = G + fin.size, 0, "none"
    if compact.limit is not None and compact.R:
        mem = _rows_subset(compact, np.arange(compact.R) if rows is None else np.asarray(rows, np.int64))
        if mem.num_rows:
            mform = form
            if form == "auto":
                inc = 2 * mem.coef.size + 3 * mem.num_rows
                mform = "direct" if mem.nnz_direct() <= max(4 * inc, 300_000) else "incremental"
            nm = _memory(acc, mem, np.arange(G), nvar, compact.limit, None, mform, compact.limit or 1.0)
    num = nvar + nm
    lb, ub = np.zeros(num), np.ones(num)
    if nm:
        ub[nvar:] = (compact.limit - mem.base) / (compact.limit or 1.0)
    ub[:G][~np.isfinite(compact.cost)] = 0.0
    obj = np.zeros(num)
    obj[:G], obj[G:nvar] = np.where(np.isfinite(compact.cost), compact.cost, 0.0), w
    top = float(np.abs(obj).max()) if num else 0.0
    scale = top / 1e4 if top > 0 else 1.0
    matrix, clb, cub = acc.csr(num)
    return Model(lb, ub, obj / scale, clb, cub, matrix, np.arange(G), int(fin.size), scale,
                 compact.const, mform)


def _x_from(compact: Compact, sol: np.ndarray) -> np.ndarray:
    if compact.n == 0:  # nothing to choose (an empty neighbourhood)
        return np.zeros(0, np.int64)
    s = sol[:int(compact.off[-1])]
    node_of = compact.node_of
    order = np.lexsort((-s, node_of))
    head = np.r_[True, node_of[order][1:] != node_of[order][:-1]]
    return order[head] - compact.off[:-1]


def _hint(compact: Compact, model: Model, x: np.ndarray) -> np.ndarray:
    """Values of the strategy variables only (the backend completes the rest)."""
    G = int(compact.off[-1])
    hint = np.full(model.lb.size, np.nan)
    on = np.zeros(G)
    on[compact.off[:-1] + x] = 1.0
    hint[:G] = on
    return hint


def _new_rows(U: np.ndarray, limit: float, batch: int) -> np.ndarray:
    """The most overflowing rows, at most ``batch``, preferring local maxima of ``U``."""
    over = np.flatnonzero(U > limit)
    if over.size <= batch:
        return over
    peak = np.r_[True, U[1:] >= U[:-1]] & np.r_[U[:-1] >= U[1:], True]
    cand = over[peak[over]]
    if cand.size < batch:
        cand = over
    return cand[np.argsort(-U[cand], kind="stable")[:batch]]


def solve_compact(compact: Compact, time_limit: float, x0: np.ndarray | None = None, *,
                  rows: np.ndarray | None = None, rel_gap: float = 1e-9, batch: int = 60,
                  seed: int = 0, solver: str = "scip", lean: bool = True, form: str = "auto",
                  log: Callable[[str], None] | None = None) -> CompactResult:
    """Solve ``compact`` exactly (up to ``rel_gap``) within ``time_limit`` seconds.

    ``x0``: a plan that fits memory (hint and fallback). ``rows``: initial memory rows
    (default: all rows when they are few, else ``x0``'s fullest rows, or none).
    """
    t0 = time.perf_counter()
    has_mem = compact.limit is not None and compact.R > 0
    best_x, best_obj = None, math.inf
    if x0 is not None and (not has_mem or (usage(compact, x0) <= compact.limit).all()):
        best_x, best_obj = x0, objective(compact, x0)
    if rows is None and has_mem and int(np.sum(compact.thi - compact.tlo)) <= 300_000:
        rows = np.arange(compact.R)
    if rows is None:
        rows = np.zeros(0, np.int64)
        if has_mem and x0 is not None:
            U = usage(compact, x0)
            rows = np.sort(np.argsort(-U, kind="stable")[:min(batch, compact.R)])
    rows = np.unique(np.asarray(rows, np.int64))
    bound, solves, optimal, status = -math.inf, 0, False, "NOT_RUN"
    params = {"scip": _SCIP.format(gap=rel_gap, seed=seed) + (_SCIP_LEAN if lean else ""),
              "highs": f"mip_rel_gap = {rel_gap}\nthreads = 1\nrandom_seed = {seed}\n"
                       "primal_feasibility_tolerance = 1e-9\n",
              "cp_sat": f"relative_gap_limit: {rel_gap} num_workers: 1 random_seed: {seed}"}.get(solver, "")
    while True:
        left = time_limit - (time.perf_counter() - t0)
        if left <= 0.05:
            break
        model = build_compact_model(compact, rows if has_mem else None, form)
        # NOTE: OR-tools 9.15's HiGHS interface segfaults on some hinted models
        hint = _hint(compact, model, best_x) if best_x is not None and solver != "highs" else None
        res = solve_model(model, solver, left, integer=True, hint=hint, params=params)
        solves, status = solves + 1, res.status
        if res.status == "OPTIMAL" or res.x is not None:
            bound = max(bound, res.bound if math.isfinite(res.bound) else -math.inf)
        if res.status == "INFEASIBLE":
            bound = math.inf
            break
        if res.x is None:
            break
        x = _x_from(compact, res.x)
        U = usage(compact, x) if has_mem else None
        if U is not None and (U > compact.limit).any():
            add = np.setdiff1d(_new_rows(U, compact.limit, batch), rows)
            if add.size == 0:  # overflow within the backend's tolerance on rows it has
                break
            if log:
                log(f"memory rows: {rows.size} + {add.size} (overflow {U.max() - compact.limit:.4g})")
            rows = np.union1d(rows, add)
            continue
        obj = objective(compact, x)
        if obj < best_obj:
            best_x, best_obj = x, obj
        optimal = res.status == "OPTIMAL"
        break
    return CompactResult(best_x, best_obj, min(bound, best_obj), optimal, status, rows, solves,
                         time.perf_counter() - t0)


def lp_dive(compact: Compact, time_limit: float, x0: np.ndarray, *, batch: int = 60,
            seed: int = 0) -> CompactResult:
    """A good plan (no proof) from the LP relaxation: GLOP, then the nodes the LP leaves
    fractional re-solved by the MIP over their LP support (others fixed at the LP's
    choice). IOPDDL M kernel (10,061 strategies): GLOP 3.5 s with 4 fractional nodes,
    where SCIP took 82 s for the same optimum. ``x0`` (fits memory) is the fallback."""
    t0 = time.perf_counter()
    has_mem = compact.limit is not None and compact.R > 0
    best_x, best_obj = x0, objective(compact, x0)
    rows = np.zeros(0, np.int64)
    if has_mem:
        U = usage(compact, x0)
        rows = np.sort(np.argsort(-U, kind="stable")[:min(batch, compact.R)])
    G, solves, status = int(compact.off[-1]), 0, "NOT_RUN"
    while time.perf_counter() - t0 < time_limit - 0.05:
        model = build_compact_model(compact, rows if has_mem else None)
        res = solve_model(model, "glop", time_limit - (time.perf_counter() - t0), integer=False)
        solves, status = solves + 1, res.status
        if res.x is None:
            break
        s = res.x[:G]
        x = _x_from(compact, res.x)
        frac = np.flatnonzero(np.maximum.reduceat(s, compact.off[:-1]) < 1 - 1e-6)
        if frac.size:  # small MIP: fractional nodes over their LP support
            keep = np.zeros(G, bool)
            keep[compact.off[:-1] + x] = True
            isf = np.zeros(compact.n, bool)
            isf[frac] = True
            keep |= isf[compact.node_of] & (s > 1e-6)
            keep[compact.off[:-1] + x0] |= isf
            sub = restrict(compact, keep)
            kg = np.flatnonzero(keep)
            r = solve_compact(sub, time_limit - (time.perf_counter() - t0), None, rows=rows,
                              seed=seed)
            solves += r.solves
            if r.x is None:
                break
            x = kg[sub.off[:-1] + r.x] - compact.off[:-1]
        if has_mem:
            U = usage(compact, x)
            if (U > compact.limit).any():
                add = np.setdiff1d(_new_rows(U, compact.limit, batch), rows)
                if add.size == 0:
                    break
                rows = np.union1d(rows, add)
                continue
        obj = objective(compact, x)
        if obj < best_obj:
            best_x, best_obj = x, obj
        break
    return CompactResult(best_x, best_obj, -math.inf, False, status, rows, solves,
                         time.perf_counter() - t0)
