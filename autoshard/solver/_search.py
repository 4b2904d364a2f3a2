"""Anytime search on a :class:`~autoshard._compact.Compact` problem: large-neighbourhood
search with exact sub-solves, node moves, and memory prices.

Every accepted step keeps the plan within the memory limit and lowers the cost (the
moves are in :mod:`autoshard._moves`):
1. *node and pair moves* (vectorized best response of single nodes and of both ends of
   every edge) until none improves;
2. *forest DP*: the exact best plan of a random induced forest, memory priced;
3. *LNS*: a BFS ball, a ball around an expensive edge, a window of the liveness timeline
   (rows near the limit), or a four times larger ball over each node's best three
   strategies, re-solved exactly by the MIP, memory included. The size adapts to about
   ``step_time`` seconds per sub-solve. Once per plan, the window turn instead takes
   every node holding memory on the rows at the limit, over each one's best few
   strategies (two, one more after each exact solve that finds nothing);
4. *kernel*: after 8 steps without a gain, the whole problem over each node's current
   strategy and its best few by score and by the dual's reparametrized cost ``theta``;
5. *restarts* (kicks): after a long stretch without improvement, a random region of the
   best plan is re-drawn (seeded); the best plan is kept.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autoshard._compact import Compact
from autoshard._moves import (best_few, costly_node, Prices, State, dp_move, kernel_move,
                              lns_move, node_moves, pair_moves)
from autoshard._neighbourhood import ball, binding, window
from autoshard._space import Space

__all__ = ["search", "SearchResult"]


@dataclass
class SearchResult:
    x: np.ndarray
    objective: float
    trace: list[tuple[float, float]]          # (seconds, incumbent) at every improvement
    stats: dict = field(default_factory=dict)


def search(cp: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
           bound: Callable[[], float] | None = None, log: Callable[[str], None] | None = None,
           every: float = 5.0, step_time: float = 0.5, budget: int = 3000,
           sp: Space | None = None, theta: Callable[[], np.ndarray | None] | None = None,
           stop_at: float = -math.inf, max_budget: int = 200_000,
           kicks: bool = True, stall: float = math.inf) -> SearchResult:
    """Improve the feasible compact plan ``x0`` until ``time_limit`` seconds have passed
    (or the objective reaches ``stop_at``, e.g. a proven bound).

    ``theta``: reparametrized costs from the dual (ranking for the kernel moves).
    ``budget``/``max_budget``: start and cap of the LNS size (variables of a sub-MIP);
    ``stats["budget"]`` is the size it adapted to (the start of a continued search).
    ``stats["exhausted"]``: an exact sub-solve covered every node, the plan is optimal.
    ``kicks=False``: no restarts from a re-drawn region (for polishing a plan near the
    bound: on IOPDDL M a kick costs the rest of a 20 s chunk to climb back, if it does).
    ``stall``: return once that many seconds pass without a better plan (kicks do not
    count), so a caller can end a stuck run early (IOPDDL V: runs reach their plan in
    2-15 s, then find nothing).
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    sp = Space(cp) if sp is None else sp
    st = State(sp, x0)
    rng = np.random.default_rng(seed)
    prices = Prices(sp)
    best_x, best_obj = st.x.copy(), st.obj
    trace = [(0.0, best_obj)]
    stats = dict(node_moves=0, dp=0, dp_better=0, lns=0, lns_better=0, lns_optimal=0, restarts=0,
                 kernel=0, kernel_better=0, binding=0, binding_better=0)
    kc, since_gain = 2, 0
    bc, binding_tried = 2, None  # strategies per node of the binding move; (plan, bc) last tried

    def few(c: int) -> np.ndarray:
        """Each node's ``c`` best strategies by score and by the dual's costs."""
        return best_few(sp, st.x, theta() if theta else None, c)

    def descend() -> None:
        """Node and pair moves after a gain, until neither improves."""
        stats["node_moves"] += node_moves(st, deadline)
        stats["pair_moves"] += pair_moves(st, deadline)

    def whole_time() -> float:
        """Time for a sub-solve over a large part of the problem."""
        left = deadline - time.perf_counter()
        return min(max(10 * step_time, 0.25 * left), left)

    last_log, last_gain = t0 - every, t0  # first line right away

    def note() -> None:
        nonlocal best_x, best_obj, last_gain, since_gain
        since_gain += 1
        if st.obj < best_obj:
            best_x, best_obj, last_gain, since_gain = st.x.copy(), st.obj, time.perf_counter(), 0
            trace.append((last_gain - t0, best_obj))

    stats["node_moves"] += node_moves(st, deadline)
    stats["pair_moves"] = pair_moves(st, deadline)
    note()
    it = 0
    while (time.perf_counter() < deadline and best_obj > stop_at
           and time.perf_counter() - t0 - trace[-1][0] < stall):  # since a better plan
        it += 1
        now = time.perf_counter()
        if log and now - last_log >= every:
            b = bound() if bound else -math.inf
            gap = (best_obj - b) / max(abs(best_obj), 1e-300) if math.isfinite(b) else math.inf
            log(f"search {now - t0:6.1f}s incumbent {best_obj:.10g} bound {b:.10g} gap {gap:.3%} "
                f"lns {stats['lns_better']}/{stats['lns']} dp {stats['dp_better']}/{stats['dp']} "
                f"kernel {stats['kernel_better']}/{stats['kernel']} "
                f"binding {stats['binding_better']}/{stats['binding']} "
                f"budget {budget} restarts {stats['restarts']}")
            last_log = now
        kind = it % 4
        if since_gain >= 4:  # local neighbourhoods stall: restricted whole-problem MIP
            since_gain = 0
            better, optimal, secs = kernel_move(st, theta() if theta else None, kc, whole_time(),
                                                int(rng.integers(1 << 20)))
            stats["kernel"] += 1
            stats["kernel_better"] += better
            kc = kc + 1 if optimal else max(kc - 1, 1)
            if better:
                descend()
            note()
            continue
        if kind == 0:
            stats["dp"] += 1
            if dp_move(st, rng, prices):
                stats["dp_better"] += 1
                prices.decay()
                stats["pair_moves"] += pair_moves(st, deadline)
        elif kind == 3 and st.U is not None and (st.obj, bc) != binding_tried:
            binding_tried = (st.obj, bc)
            better, optimal, secs = lns_move(st, binding(sp, st.U, 4 * budget, rng),
                                             whole_time(), int(rng.integers(1 << 20)), few(bc))
            stats["binding"] += 1
            stats["binding_better"] += better
            # nothing cheaper within bc strategies per node: widen (all of them at most)
            bc = 2 if better else min(bc + optimal, int(sp.k.max()) + 1)
            if better:
                descend()
        else:
            if kind == 3 and st.U is not None:
                rows = np.flatnonzero(st.U >= np.quantile(st.U, 0.9))
                S = window(sp, int(rng.choice(rows)), budget, rng)
            elif kind == 2:
                S = ball(sp, costly_node(st, rng), budget, rng)
            else:  # a ball four times larger over each node's best few strategies
                S = ball(sp, int(rng.integers(sp.n)), 4 * budget, rng)
            left = deadline - time.perf_counter()
            if left < 0.2:
                break
            keep = few(3) if kind == 1 else None
            better, optimal, secs = lns_move(st, S, min(4 * step_time, left),
                                             int(rng.integers(1 << 20)), keep)
            stats["lns"] += 1
            stats["lns_better"] += better
            stats["lns_optimal"] += optimal
            if optimal and S.size == sp.n and keep is None:  # the whole problem, solved exactly
                stats["exhausted"] = True
                note()
                break
            # aim at ~step_time per sub-solve
            f = min(max((step_time / max(secs, 1e-3)) ** 0.5, 0.7), 1.3) if optimal else 0.6
            budget = min(max(int(budget * f), 50), max_budget)
            if better:
                descend()
        note()
        stag = time.perf_counter() - last_gain
        if (kicks and stag > max(0.15 * time_limit, 10.0)
                and deadline - time.perf_counter() > 0.2 * time_limit):
            stats["restarts"] += 1
            x = best_x.copy()
            S = ball(sp, int(rng.integers(sp.n)), budget * 3, rng)
            for u in S.tolist():
                x[u] = rng.integers(sp.k[u])
            ok, _ = st.fits(x)
            st.set(best_x if not ok else x)
            last_gain = time.perf_counter()
    stats["seconds"] = time.perf_counter() - t0
    stats["sub_failures"] = st.failures
    stats["budget"] = budget
    return SearchResult(best_x, best_obj, trace, stats)
