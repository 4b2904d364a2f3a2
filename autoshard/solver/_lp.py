"""Build the marginal-form ILP as sparse numpy arrays and solve it through OR-tools.

The model is assembled as one CSR matrix and loaded with OR-tools' model builder
(``ModelBuilderHelper.fill_model_from_sparse_data``), the vectorized front end of the
same MPSolver backends pywraplp drives (GLOP, PDLP, SCIP, HiGHS, CP-SAT): creating a
million edge variables one pywraplp call at a time costs seconds of Python, this costs
milliseconds.

Variables: ``s`` (binary, allowed strategies of free nodes), ``e`` (continuous [0, 1],
finite entries of kept edges), then either nothing (direct memory rows) or one running
memory sum ``M_r`` per kept memory row (incremental form, for instances where the direct
rows would hold too many nonzeros), and for the min-peak model a peak variable ``z``.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy.sparse as sp
from ortools.linear_solver.python import model_builder_helper as mbh

from autoshard.solver._memory import MemoryRows
from autoshard.solver._presolve import Reduced

__all__ = ["Model", "LpResult", "build_model", "solve_model"]


@dataclass(frozen=True, slots=True)
class Model:
    lb: np.ndarray
    ub: np.ndarray
    obj: np.ndarray
    clb: np.ndarray
    cub: np.ndarray
    matrix: sp.csr_matrix
    sg: np.ndarray          # global strategy of each s variable (s vars are 0..len(sg)-1)
    num_e: int
    obj_scale: float        # objective = obj_scale * (obj @ x) + offset
    offset: float
    memory_form: str        # "none", "direct" or "incremental"

    @property
    def num_s(self) -> int:
        return int(self.sg.size)


@dataclass(frozen=True, slots=True)
class LpResult:
    status: str             # mbh.SolveStatus name
    x: np.ndarray | None
    objective: float
    bound: float
    seconds: float


class _Rows:
    """COO accumulator: ``add(rows, cols, vals)`` with row ids from ``new(n, lb, ub)``."""

    def __init__(self) -> None:
        self.r, self.c, self.v, self.lb, self.ub, self.n = [], [], [], [], [], 0

    def new(self, count: int, lb, ub) -> int:
        first = self.n
        self.lb.append(np.broadcast_to(np.asarray(lb, np.float64), (count,)))
        self.ub.append(np.broadcast_to(np.asarray(ub, np.float64), (count,)))
        self.n += count
        return first

    def add(self, rows, cols, vals) -> None:
        rows, cols = np.asarray(rows, np.int64), np.asarray(cols, np.int64)
        self.r.append(rows)
        self.c.append(cols)
        self.v.append(np.broadcast_to(np.asarray(vals, np.float64), rows.shape))

    def csr(self, num_vars: int) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
        cat = lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dt)  # noqa: E731
        m = sp.coo_matrix((cat(self.v, np.float64), (cat(self.r, np.int64), cat(self.c, np.int64))),
                          shape=(self.n, num_vars)).tocsr()
        m.sum_duplicates()
        return m, cat(self.lb, np.float64), cat(self.ub, np.float64)


def _marginals(rows: _Rows, red: Reduced, sidx: np.ndarray, ns: int) -> None:
    G = red.cost.size
    evar = ns + np.arange(red.c.size)
    for side in (red.A, red.B):
        key, inv = np.unique(red.edge * G + side, return_inverse=True)
        first = rows.new(key.size, 0.0, 0.0)
        rows.add(first + inv, evar, 1.0)
        rows.add(first + np.arange(key.size), sidx[key % G], -1.0)


def _memory(rows: _Rows, mem: MemoryRows, sidx: np.ndarray, nvar: int, limit: float | None,
            zvar: int | None, form: str, mscale: float) -> int:
    """Add memory rows; returns the number of extra (M) variables, placed from ``nvar``."""
    R, coef = mem.num_rows, mem.coef / mscale
    cap = np.full(R, np.inf) if limit is None else (limit - mem.base) / mscale
    svar = sidx[mem.g]
    if form == "direct":
        ub = -mem.base / mscale if zvar is not None else cap
        first = rows.new(R, -np.inf, ub)
        span = mem.hi - mem.lo
        rep = np.repeat(np.arange(span.size), span)
        within = np.arange(rep.size) - np.repeat(np.cumsum(span) - span, span)
        rows.add(first + mem.lo[rep] + within, svar[rep], coef[rep])
        if zvar is not None:
            rows.add(first + np.arange(R), np.full(R, zvar), -1.0)
        return 0
    # incremental: M_r - M_{r-1} - (entering excess) + (leaving excess) = 0
    first = rows.new(R, 0.0, 0.0)
    rows.add(first + np.arange(R), nvar + np.arange(R), 1.0)
    rows.add(first + np.arange(1, R), nvar + np.arange(R - 1), -1.0)
    rows.add(first + mem.lo, svar, -coef)
    out = mem.hi < R
    rows.add(first + mem.hi[out], svar[out], coef[out])
    if zvar is not None:
        top = rows.new(R, -np.inf, -mem.base / mscale)
        rows.add(top + np.arange(R), nvar + np.arange(R), 1.0)
        rows.add(top + np.arange(R), np.full(R, zvar), -1.0)
    return R


def build_model(red: Reduced, mem: MemoryRows | None, *, limit: float | None = None,
                peak: bool = False, form: str = "auto") -> Model:
    """The marginal-form model of ``red``; ``peak=True`` minimizes peak memory instead."""
    f = red.flat
    free = np.bincount(f.node_of, weights=red.allowed, minlength=f.n) > 1
    sg = np.flatnonzero(red.allowed & free[f.node_of])
    sidx = np.full(red.cost.size, -1, np.int64)
    sidx[sg] = np.arange(sg.size)
    ns, ne = sg.size, red.c.size
    rows = _Rows()
    nodes = f.node_of[sg]
    node_row = np.cumsum(free) - 1
    first = rows.new(int(free.sum()), 1.0, 1.0)
    rows.add(first + node_row[nodes], np.arange(ns), 1.0)
    _marginals(rows, red, sidx, ns)
    nvar, nm, zvar, mform = ns + ne, 0, None, "none"
    if mem is not None and mem.num_rows:
        mform = form
        if form == "auto":
            inc = 2 * mem.coef.size + 3 * mem.num_rows
            mform = "direct" if mem.nnz_direct() <= max(4 * inc, 300_000) else "incremental"
        mscale = (limit if limit else float(np.abs(mem.base).max() + np.abs(mem.coef).max())) or 1.0
        zvar = nvar if peak else None
        nm = _memory(rows, mem, sidx, nvar + (1 if peak else 0), limit, zvar, mform, mscale)
    num_vars = nvar + (1 if peak else 0) + nm
    lb, ub = np.zeros(num_vars), np.ones(num_vars)
    ub[nvar:] = np.inf
    if nm:
        ub[num_vars - nm:] = (np.inf if limit is None else (limit - mem.base) / mscale)
    obj = np.zeros(num_vars)
    if peak:
        obj[nvar], scale, offset = 1.0, mscale, 0.0
    else:
        obj[:ns], obj[ns:nvar] = red.cost[sg], red.c
        top = float(np.abs(obj).max()) if num_vars else 0.0
        scale, offset = (top / 1e4 if top > 0 else 1.0), red.const
        obj /= scale
    matrix, clb, cub = rows.csr(num_vars)
    return Model(lb, ub, obj, clb, cub, matrix, sg, ne, scale, offset, mform)


class _Heartbeat:
    """A line every ``every`` seconds while the solver runs (it releases the GIL)."""

    def __init__(self, log: Callable[[str], None], t0: float, limit: float, every: float = 5.0):
        self.log, self.t0, self.limit, self.every = log, t0, limit, every
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(self.every):
            el = time.perf_counter() - self.t0
            self.log(f"still solving: {el:.0f}s of {self.limit:.0f}s")

    def __enter__(self) -> "_Heartbeat":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


@contextlib.contextmanager
def _stdout_to(path: str | None):
    """Send C-level stdout (the native solver log) to ``path``, or stderr if None."""
    sys.stdout.flush()
    saved = os.dup(1)
    target = os.open(path, os.O_WRONLY) if path else None
    try:
        os.dup2(2 if target is None else target, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        if target is not None:
            os.close(target)


def solve_model(model: Model, solver: str, time_limit: float, *, integer: bool,
                hint: np.ndarray | None = None, params: str = "",
                log: Callable[[str], None] | None = None) -> LpResult:
    """Solve ``model`` (LP if not ``integer``) with OR-tools backend ``solver``."""
    t0 = time.perf_counter()
    h = mbh.ModelBuilderHelper()
    h.fill_model_from_sparse_data(model.lb, model.ub, model.obj, model.clb, model.cub, model.matrix)
    if integer:
        for i in range(model.num_s):
            h.set_var_integrality(i, True)
    if hint is not None:
        for i in np.flatnonzero(~np.isnan(hint)).tolist():
            h.add_hint(i, float(hint[i]))
    s = mbh.ModelSolverHelper(solver)
    if not s.solver_is_supported():
        raise ValueError(f"OR-tools solver {solver!r} is not available here")
    s.set_time_limit_in_seconds(max(time_limit, 0.01))
    if params:
        s.set_solver_specific_parameters(params)
    if log is None:
        with _stdout_to(os.devnull) if solver == "highs" else contextlib.nullcontext():
            s.solve(h)  # HiGHS prints its banner to stdout even without output enabled
    else:  # NOTE: this pybind build has no std::function caster, so no log callback
        s.enable_output(True)
        with _stdout_to(None), _Heartbeat(log, t0, time_limit):
            s.solve(h)
    status = s.status().name
    x = s.variable_values() if s.has_solution() else None
    obj = s.objective_value() * model.obj_scale + model.offset if x is not None else math.inf
    bound = s.best_objective_bound() * model.obj_scale + model.offset if s.has_response() else -math.inf
    if not math.isfinite(bound):
        bound = -math.inf
    return LpResult(status, None if x is None else np.asarray(x), obj, bound, time.perf_counter() - t0)
