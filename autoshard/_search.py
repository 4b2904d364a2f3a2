"""Anytime search on a :class:`~autoshard._compact.Compact` problem: large-neighbourhood
search with exact sub-solves, node moves, and memory prices.

Every accepted step keeps the plan within the memory limit and lowers the cost:
1. *node moves* (vectorized best response): every node's best strategy given its
   neighbours; an independent set of improving nodes moves at once. Moves that raise
   no member's memory are always safe; others are checked exactly, one by one.
2. *forest DP* (:mod:`autoshard._treedp`): the exact best plan of a random induced
   forest, with memory as Lagrangian prices on the rows (raised on overflow); kept only
   when it fits and is cheaper.
3. *LNS*: a BFS ball or a window of the liveness timeline is re-solved exactly by the
   MIP (:mod:`autoshard._cmodel` on :func:`autoshard._neighbourhood.sub_compact`),
   memory included. Its size adapts: grown after quick optimal solves, shrunk after
   timeouts.
4. *restarts*: after a stretch without improvement, a random region of the best plan is
   re-drawn (seeded) and the search continues from there; the best plan is kept.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autoshard._cmodel import FAILED, solve_compact
from autoshard._compact import Compact, objective, restrict
from autoshard._neighbourhood import ball, sub_compact, window
from autoshard._space import RangeMax, Space
from autoshard._treedp import forest_dp, random_forest

__all__ = ["search", "SearchResult"]


@dataclass
class SearchResult:
    x: np.ndarray
    objective: float
    trace: list[tuple[float, float]]          # (seconds, incumbent) at every improvement
    stats: dict = field(default_factory=dict)


class _State:
    def __init__(self, sp: Space, x: np.ndarray) -> None:
        self.sp = sp
        self.failures = 0  # sub-solves the backend could not complete
        self.set(x)

    def set(self, x: np.ndarray) -> None:
        self.x = x.copy()
        self.obj = objective(self.sp.cp, self.x)
        self.U = self.sp.usage(self.x) if self.sp.limit is not None else None
        self._rmax = None

    def fits(self, x: np.ndarray) -> tuple[bool, np.ndarray | None]:
        if self.sp.limit is None:
            return True, None
        U = self.sp.usage(x)
        return bool((U <= self.sp.limit).all()), U

    @property
    def rmax(self) -> RangeMax | None:
        if self._rmax is None and self.U is not None:
            self._rmax = RangeMax(self.U)
        return self._rmax

    def offer(self, x: np.ndarray) -> bool:
        """Take ``x`` if it fits and is cheaper."""
        obj = objective(self.sp.cp, x)
        if obj >= self.obj - 1e-12 * max(abs(self.obj), 1.0):
            return False
        ok, U = self.fits(x)
        if not ok:
            return False
        self.x, self.obj, self.U, self._rmax = x.copy(), obj, U, None
        return True


def _safe_mask(sp: Space, x: np.ndarray) -> np.ndarray:
    """Strategies each node can move to without raising any member's memory."""
    mask = np.ones(int(sp.off[-1]), bool)
    for u, s in enumerate(sp.safe):
        if s is not None:
            mask[sp.off[u]:sp.off[u + 1]] = s[x[u]]
    return mask


def node_moves(st: _State, deadline: float, max_checks: int = 200) -> int:
    """Best-response rounds until no node improves; returns the number of moves made."""
    sp, moved = st.sp, 0
    while time.perf_counter() < deadline:
        x = st.x
        sc = sp.scores(x)
        cur = sc[sp.off[:-1] + x]
        safe = _safe_mask(sp, x) if sp.limit is not None else None
        best = np.minimum.reduceat(np.where(safe, sc, math.inf) if safe is not None else sc,
                                   sp.off[:-1])
        with np.errstate(invalid="ignore"):  # inf - inf: no finite move, no gain
            gain = np.nan_to_num(cur - best, nan=0.0)
        cand = gain > 1e-12 * np.maximum(np.abs(cur), 1.0)
        new = x.copy()
        if cand.any():
            blocked = np.zeros(sp.n, bool)
            both = cand[sp.eu] & cand[sp.ev]
            u, v = sp.eu[both], sp.ev[both]
            uw = (gain[u] > gain[v]) | ((gain[u] == gain[v]) & (u < v))
            blocked[v[uw]] = True
            blocked[u[~uw]] = True
            move = np.flatnonzero(cand & ~blocked)
            val = np.where(safe, sc, math.inf) if safe is not None else sc
            for_node = val == best[sp.node_of]
            g = np.flatnonzero(for_node & np.isin(sp.node_of, move))[::-1]
            first = np.full(sp.n, -1, np.int64)
            first[sp.node_of[g]] = g
            new[move] = first[move] - sp.off[move]
        if sp.limit is not None:  # memory-raising moves, checked exactly
            raw_best = np.minimum.reduceat(sc, sp.off[:-1])
            with np.errstate(invalid="ignore"):
                raw_gain = np.nan_to_num(cur - raw_best, nan=0.0)
            up = np.flatnonzero((raw_gain > 1e-12 * np.maximum(np.abs(cur), 1.0)) & ~cand)
            up = up[np.argsort(-raw_gain[up], kind="stable")][:max_checks]
            U = st.U.copy()
            for u in up.tolist():
                seg = sc[sp.off[u]:sp.off[u + 1]]
                for q in np.argsort(seg, kind="stable").tolist():
                    if seg[q] >= cur[u] - 1e-12 * max(abs(cur[u]), 1.0):
                        break
                    if sp.move_fits(U, u, int(x[u]), q):
                        sp.apply_move(U, u, int(x[u]), q)
                        new[u] = q
                        break
        if np.array_equal(new, x) or not st.offer(new):
            # simultaneous moves of non-adjacent nodes cannot raise the cost; a rejected
            # batch means the memory-raising moves interacted: retry the safe ones only
            if not np.array_equal(new, x) and cand.any():
                safe_only = x.copy()
                safe_only[move] = new[move]
                if st.offer(safe_only):
                    moved += int(move.size)
                    continue
            return moved
        moved += int((new != x).sum())
    return moved


def pair_moves(st: _State, deadline: float, max_checks: int = 300) -> int:
    """Best joint re-choice of the two ends of every edge, others fixed; improving pairs
    that are not adjacent move together. Returns the number of pairs moved."""
    sp, moved = st.sp, 0
    cp = sp.cp
    if cp.m == 0:
        return 0
    e, r, c = sp.entries
    ru, cv = r - sp.off[sp.eu][e], c - sp.off[sp.ev][e]
    kv = sp.k[sp.ev][e]
    while time.perf_counter() < deadline:
        x = st.x
        fin, nbad = sp.scores_split(x)
        xu, xv = x[sp.eu][e], x[sp.ev][e]
        w_r, w_c = sp.W[sp.ebase[e] + ru * kv + xv], sp.W[sp.ebase[e] + xu * kv + cv]
        # each end's score without this edge's term (forbidden terms counted apart)
        bad = (nbad[r] - np.isinf(w_r) + nbad[c] - np.isinf(w_c)) > 0
        joint = (fin[r] - np.where(np.isinf(w_r), 0.0, w_r) + fin[c]
                 - np.where(np.isinf(w_c), 0.0, w_c) + sp.W)
        joint[bad] = math.inf
        cur = joint[sp.ebase[:-1] + x[sp.eu] * sp.k[sp.ev] + x[sp.ev]]
        best = np.minimum.reduceat(joint, sp.ebase[:-1])
        gain = cur - best
        cand = np.flatnonzero(gain > 1e-9 * np.maximum(np.abs(cur), 1.0))
        if cand.size == 0:
            return moved
        cand = cand[np.argsort(-gain[cand], kind="stable")][:max_checks]
        hit = np.flatnonzero(joint == best[e])
        first = np.full(cp.m, -1, np.int64)
        first[e[hit][::-1]] = hit[::-1]
        blocked = np.zeros(sp.n, bool)
        new = x.copy()
        U = st.U.copy() if st.U is not None else None
        for ed in cand.tolist():
            u, v = int(sp.eu[ed]), int(sp.ev[ed])
            if blocked[u] or blocked[v]:
                continue
            i = int(first[ed])
            p, q = int(ru[i]), int(cv[i])
            if U is not None:
                if not sp.move_fits(U, u, int(x[u]), p):
                    continue
                sp.apply_move(U, u, int(x[u]), p)
                if not sp.move_fits(U, v, int(x[v]), q):
                    sp.apply_move(U, u, p, int(x[u]))
                    continue
                sp.apply_move(U, v, int(x[v]), q)
            new[u], new[v] = p, q
            for w in (u, v):
                blocked[w] = True
                blocked[sp.nbr[sp.nptr[w]:sp.nptr[w + 1]]] = True
        if np.array_equal(new, x) or not st.offer(new):
            return moved
        moved += int(((new != x)).sum())
    return moved


class _Prices:
    """Lagrangian memory prices for the DP moves."""

    def __init__(self, sp: Space) -> None:
        self.sp = sp
        self.price = np.zeros(sp.cp.R)
        fin = sp.cost[np.isfinite(sp.cost)]
        cs = float(np.abs(fin).mean()) if fin.size else 1.0
        ex = sp.t_coef[sp.t_coef > 0]
        self.eta = cs / float(ex.mean()) ** 2 if ex.size else 0.0

    def extra(self) -> np.ndarray | None:
        if self.sp.limit is None or not self.price.any():
            return None
        P = np.concatenate([[0.0], np.cumsum(self.price)])
        w = self.sp.t_coef * (P[self.sp.t_hi] - P[self.sp.t_lo])
        return np.bincount(self.sp.t_g, weights=w, minlength=int(self.sp.off[-1]))

    def raise_on(self, U: np.ndarray) -> None:
        over = np.maximum(U - self.sp.limit, 0.0)
        self.price += self.eta * over
        self.eta *= 1.5

    def decay(self) -> None:
        self.price *= 0.7


def _touching(sp: Space, U: np.ndarray, margin: float) -> np.ndarray:
    """Nodes with a memory term on a row within ``margin`` (fraction) of the limit."""
    tight = np.concatenate([[0], np.cumsum(U > sp.limit * (1.0 - margin))])
    hit = tight[sp.t_hi] - tight[sp.t_lo] > 0
    out = np.zeros(sp.n, bool)
    out[sp.node_of[sp.t_g[hit]]] = True
    return out


def dp_move(st: _State, rng: np.random.Generator, prices: _Prices, margin: float = 0.02) -> bool:
    """Exact best plan of a random induced forest; nodes near full rows keep to moves
    that raise no member's memory, the others pay the memory prices."""
    sp = st.sp
    forest = random_forest(sp, rng)
    extra = prices.extra()
    if sp.limit is not None:
        block = ~_safe_mask(sp, st.x) & _touching(sp, st.U, margin)[sp.node_of]
        extra = np.where(block, math.inf, 0.0 if extra is None else extra)
    new = forest_dp(sp, sp.off[:-1] + st.x, forest, extra) - sp.off[:-1]
    ok, U = st.fits(new)
    if not ok:
        prices.raise_on(U)
        return False
    return st.offer(new)


def _costly_node(st: _State, rng: np.random.Generator) -> int:
    """An end of an edge drawn with probability growing with the edge's current cost."""
    sp = st.sp
    if sp.cp.m == 0:
        return int(rng.integers(sp.n))
    w = sp.W[sp.ebase[:-1] + st.x[sp.eu] * sp.k[sp.ev] + st.x[sp.ev]]
    order = np.argsort(-w, kind="stable")
    rank = order[min(int(rng.geometric(0.02)) - 1, order.size - 1)]  # mostly the top few %
    return int(sp.eu[rank] if rng.random() < 0.5 else sp.ev[rank])


def lns_move(st: _State, S: np.ndarray, time_limit: float, seed: int) -> tuple[bool, bool, float]:
    """Re-solve nodes ``S`` exactly; returns (improved, solved to optimality, seconds)."""
    sub = sub_compact(st.sp, S, st.x, st.U, st.rmax)
    x0 = st.x[np.sort(S)]
    res = solve_compact(sub, time_limit, x0, seed=seed)
    if res.status in FAILED:
        st.failures += 1
    if res.x is None:
        return False, res.optimal, res.seconds
    new = st.x.copy()
    new[np.sort(S)] = res.x
    return st.offer(new), res.optimal, res.seconds


def _top(sp: Space, val: np.ndarray, c: int) -> np.ndarray:
    """Mask of each node's ``c`` lowest values of ``val``."""
    o = np.lexsort((val, sp.node_of))
    rank = np.empty(o.size, np.int64)
    rank[o] = np.arange(o.size) - sp.off[:-1][sp.node_of[o]]
    return rank < c


def kernel_move(st: _State, theta: np.ndarray | None, c: int, time_limit: float,
                seed: int) -> tuple[bool, bool, float]:
    """Re-solve the whole problem exactly with each node restricted to its current
    strategy and its ``c`` best by score and by reparametrized cost ``theta``."""
    sp = st.sp
    keep = _top(sp, sp.scores(st.x), c)
    if theta is not None:
        keep |= _top(sp, theta, c)
    cur = sp.off[:-1] + st.x
    keep[cur] = True
    sub = restrict(sp.cp, keep)
    kg = np.flatnonzero(keep)
    xs = np.searchsorted(kg, cur) - sub.off[:-1]
    res = solve_compact(sub, time_limit, xs, seed=seed)
    if res.status in FAILED:
        st.failures += 1
    if res.x is None:
        return False, res.optimal, res.seconds
    new = kg[sub.off[:-1] + res.x] - sp.off[:-1]
    return st.offer(new), res.optimal, res.seconds


def search(cp: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
           bound: Callable[[], float] | None = None, log: Callable[[str], None] | None = None,
           every: float = 5.0, step_time: float = 0.5, budget: int = 3000,
           sp: Space | None = None, theta: Callable[[], np.ndarray | None] | None = None,
           stop_at: float = -math.inf, max_budget: int = 200_000) -> SearchResult:
    """Improve the feasible compact plan ``x0`` until ``time_limit`` seconds have passed
    (or the objective reaches ``stop_at``, e.g. a proven bound).

    ``theta``: reparametrized costs from the dual (ranking for the kernel moves).
    ``budget``/``max_budget``: start and cap of the LNS size (variables of a sub-MIP).
    ``stats["exhausted"]``: an exact sub-solve covered every node, the plan is optimal.
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    sp = Space(cp) if sp is None else sp
    st = _State(sp, x0)
    rng = np.random.default_rng(seed)
    prices = _Prices(sp)
    best_x, best_obj = st.x.copy(), st.obj
    trace = [(0.0, best_obj)]
    stats = dict(node_moves=0, dp=0, dp_better=0, lns=0, lns_better=0, lns_optimal=0, restarts=0,
                 kernel=0, kernel_better=0)
    kc, since_gain = 2, 0
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
    while time.perf_counter() < deadline and best_obj > stop_at:
        it += 1
        now = time.perf_counter()
        if log and now - last_log >= every:
            b = bound() if bound else -math.inf
            gap = (best_obj - b) / max(abs(best_obj), 1e-300) if math.isfinite(b) else math.inf
            log(f"search {now - t0:6.1f}s incumbent {best_obj:.10g} bound {b:.10g} gap {gap:.3%} "
                f"lns {stats['lns_better']}/{stats['lns']} dp {stats['dp_better']}/{stats['dp']} "
                f"kernel {stats['kernel_better']}/{stats['kernel']} "
                f"budget {budget} restarts {stats['restarts']}")
            last_log = now
        kind = it % 4
        if since_gain >= 8:  # local neighbourhoods stall: restricted whole-problem MIP
            since_gain = 0
            left = deadline - time.perf_counter()
            better, optimal, secs = kernel_move(st, theta() if theta else None, kc,
                                                min(max(10 * step_time, 0.25 * left), left),
                                                int(rng.integers(1 << 20)))
            stats["kernel"] += 1
            stats["kernel_better"] += better
            kc = kc + 1 if optimal else max(kc - 1, 1)
            if better:
                stats["node_moves"] += node_moves(st, deadline)
                stats["pair_moves"] += pair_moves(st, deadline)
            note()
            continue
        if kind == 0:
            stats["dp"] += 1
            if dp_move(st, rng, prices):
                stats["dp_better"] += 1
                prices.decay()
                stats["pair_moves"] += pair_moves(st, deadline)
        else:
            if kind == 3 and st.U is not None:
                rows = np.flatnonzero(st.U >= np.quantile(st.U, 0.9))
                S = window(sp, int(rng.choice(rows)), budget, rng)
            elif kind == 2:
                S = ball(sp, _costly_node(st, rng), budget, rng)
            else:
                S = ball(sp, int(rng.integers(sp.n)), budget, rng)
            left = deadline - time.perf_counter()
            if left < 0.2:
                break
            better, optimal, secs = lns_move(st, S, min(4 * step_time, left),
                                             int(rng.integers(1 << 20)))
            stats["lns"] += 1
            stats["lns_better"] += better
            stats["lns_optimal"] += optimal
            if optimal and S.size == sp.n:  # the whole problem was solved exactly
                stats["exhausted"] = True
                note()
                break
            # aim at ~step_time per sub-solve
            f = min(max((step_time / max(secs, 1e-3)) ** 0.5, 0.7), 1.3) if optimal else 0.6
            budget = min(max(int(budget * f), 50), max_budget)
            if better:
                stats["node_moves"] += node_moves(st, deadline)
                stats["pair_moves"] += pair_moves(st, deadline)
        note()
        stag = time.perf_counter() - last_gain
        if stag > max(0.15 * time_limit, 10.0) and deadline - time.perf_counter() > 0.2 * time_limit:
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
    return SearchResult(best_x, best_obj, trace, stats)
