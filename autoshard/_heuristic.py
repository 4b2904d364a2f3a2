"""A fast memory-aware primal heuristic for the presolved strategy problem.

Finds a feasible plan in seconds on instances whose ILP is too big for the LP/MIP
within the time limit (IOPDDL V, P, M), and gives the MIP its hint and incumbent.

1. Construction: free nodes in index order (roughly topological in XLA dumps), each
   taking the strategy with the least node cost plus edge cost to the already-decided
   neighbours, among those that fit the memory still free over its live interval
   (undecided nodes count at their minimum memory, so a fitting choice always exists
   once the minimum-memory plan fits). A forbidden (``inf``) edge entry counts as a
   large penalty instead of ruling the choice out, so the construction never gets stuck.
2. Local search (iterated best response, vectorized): every round computes every free
   node's best strategy given its neighbours and the memory left in its interval,
   then moves an independent set of improving nodes at once (each improving node whose
   gain beats all improving neighbours'); memory-increasing moves are re-checked one by
   one. Rounds repeat until no node improves. Penalized (``inf``) edges go first.
3. Perturbation (optional, while time is left): re-randomize a few nodes and their
   neighbours, re-run the local search, keep the result if it is better.

All state is flat numpy arrays: edge matrices stored densely per kept edge, and one
"incidence entry" per (edge, side, strategy of that side), so the score of every
strategy is one gather plus one ``bincount``. Deterministic (fixed seed).
"""
from __future__ import annotations

import math
import time

import numpy as np

from autoshard._memory import MemoryRows
from autoshard._presolve import Reduced
from autoshard._treedp import forest_dp, random_forest, row_min

__all__ = ["heuristic_plan"]


class _State:
    """Static arrays of the presolved problem, indexed by global strategy ``g``."""

    def __init__(self, red: Reduced, mem: MemoryRows | None, limit: float | None) -> None:
        f = red.flat
        self.f, self.red = f, red
        self.n, self.k, self.off, self.node_of = f.n, f.k, f.off, f.node_of
        self.free_mask = red.fixed < 0
        self.cost = np.where(red.allowed, red.cost, math.inf)
        self.free = np.flatnonzero(red.fixed < 0)
        nu, nv = f.node_of[red.A], f.node_of[red.B]
        m = red.num_edges
        eu, ev = np.zeros(m, np.int64), np.zeros(m, np.int64)
        eu[red.edge], ev[red.edge] = nu, nv
        ku, kv = f.k[eu], f.k[ev]
        size = ku * kv
        base = np.zeros(m, np.int64)
        if m:
            base[1:] = np.cumsum(size)[:-1]
        W = np.full(int(size.sum()), math.inf)
        W[base[red.edge] + (red.A - f.off[nu]) * kv[red.edge] + (red.B - f.off[nv])] = red.c
        finite = W[np.isfinite(W)]
        top = max(float(np.abs(finite).max()) if finite.size else 0.0,
                  float(np.abs(self.cost[np.isfinite(self.cost)]).max()) if self.cost.size else 0.0, 1.0)
        deg = np.bincount(np.concatenate([eu, ev]), minlength=f.n)
        self.big = top * (float(deg.max()) + 2.0 if deg.size else 2.0) * 10.0
        self.W = np.where(np.isinf(W), self.big, W)
        self.eu, self.ev, self.ebase = eu, ev, base
        # incidence entries: u side (strategy p of u, other v): base + p*kv + q
        #                    v side (strategy q of v, other u): base + q + p*kv
        eidx_u = np.repeat(np.arange(m), ku)
        p = np.arange(int(ku.sum())) - np.repeat(np.cumsum(ku) - ku, ku)
        eidx_v = np.repeat(np.arange(m), kv)
        q = np.arange(int(kv.sum())) - np.repeat(np.cumsum(kv) - kv, kv)
        tgt = np.concatenate([f.off[eu][eidx_u] + p, f.off[ev][eidx_v] + q])
        static = np.concatenate([base[eidx_u] + p * kv[eidx_u], base[eidx_v] + q])
        other = np.concatenate([ev[eidx_u], eu[eidx_v]])
        mult = np.concatenate([np.ones(eidx_u.size, np.int64), kv[eidx_v]])
        order = np.argsort(tgt, kind="stable")
        self.tgt, self.static, self.other, self.mult = tgt[order], static[order], other[order], mult[order]
        tnode = f.node_of[self.tgt]
        self.ip = np.searchsorted(tnode, np.arange(f.n + 1))
        # memory: excess per strategy over the node's minimum, on the kept memory rows
        G = f.off[-1]
        self.exc = np.zeros(G)
        self.lo, self.hi = np.zeros(f.n, np.int64), np.zeros(f.n, np.int64)
        self.mem = mem if (mem is not None and limit is not None and mem.num_rows) else None
        if self.mem is not None:
            self.exc[mem.g] = mem.coef
            nodes = f.node_of[mem.g]
            self.lo[nodes], self.hi[nodes] = mem.lo, mem.hi
            self.cap = limit - 1e-9 * abs(limit)
            self.base = mem.base.copy()

    # ---- scoring -----------------------------------------------------------------
    def scores(self, ch: np.ndarray) -> np.ndarray:
        """Score of every global strategy given the current choice ``ch`` (global ids)."""
        f = self.f
        loc = ch - f.off[:-1]
        vals = self.W[self.static + loc[self.other] * self.mult]
        return self.cost + np.bincount(self.tgt, weights=vals, minlength=self.cost.size)

    def objective(self, ch: np.ndarray) -> float:
        """Penalized objective of the free part (node costs + kept edges)."""
        f = self.f
        loc = ch - f.off[:-1]
        kv = f.k[self.ev]
        base = np.zeros(self.eu.size, np.int64)
        if self.eu.size:
            base[1:] = np.cumsum(f.k[self.eu] * kv)[:-1]
        e = self.W[base + loc[self.eu] * kv + loc[self.ev]]
        return float(np.sum(self.cost[ch[self.free]]) + np.sum(e))

    def usage(self, ch: np.ndarray) -> np.ndarray:
        R = self.base.size
        diff = np.zeros(R + 1)
        v = self.free
        x = self.exc[ch[v]]
        np.add.at(diff, self.lo[v], x)
        np.add.at(diff, self.hi[v], -x)
        return self.base + np.cumsum(diff)[:R]


def _range_max(U: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(U[lo:hi]) for every pair (sparse table); -inf for empty ranges."""
    R = U.size
    out = np.full(lo.size, -math.inf)
    ok = hi > lo
    if R == 0 or not ok.any():
        return out
    table = [U]
    j = 1
    while 2 * j <= R:
        prev = table[-1]
        table.append(np.maximum(prev[:-j], prev[j:]))
        j *= 2
    a, b = lo[ok], hi[ok]
    lvl = np.floor(np.log2(b - a)).astype(np.int64)
    res = np.empty(a.size)
    for L in np.unique(lvl).tolist():
        sel = lvl == L
        t = table[L]
        res[sel] = np.maximum(t[a[sel]], t[b[sel] - (1 << L)])
    out[ok] = res
    return out


def _construct(st: _State, order: np.ndarray, weight: float) -> np.ndarray:
    f = st.f
    ch = f.off[:-1] + np.maximum(st.red.fixed, 0)
    decided = st.red.fixed >= 0
    U = st.base.copy() if st.mem is not None else None
    for v in order.tolist():
        g0, g1 = int(f.off[v]), int(f.off[v + 1])
        score = st.cost[g0:g1].copy()
        a, b = int(st.ip[v]), int(st.ip[v + 1])
        if b > a:
            o = st.other[a:b]
            dec = decided[o]
            vals = st.W[st.static[a:b] + (ch[o] - f.off[o]) * st.mult[a:b]]
            score += np.bincount(st.tgt[a:b][dec] - g0, weights=vals[dec], minlength=g1 - g0)
        if U is not None and st.hi[v] > st.lo[v]:
            lo, hi = int(st.lo[v]), int(st.hi[v])
            room = st.cap - U[lo:hi].max()
            ex = st.exc[g0:g1]
            score = np.where(ex <= room, score + weight * ex, math.inf)
        if not np.isfinite(score).any():  # cannot happen while the min-memory plan fits
            score = np.where(np.isfinite(st.cost[g0:g1]), st.exc[g0:g1], math.inf)
        best = g0 + int(np.argmin(score))
        ch[v] = best
        decided[v] = True
        if U is not None and st.exc[best]:
            U[int(st.lo[v]):int(st.hi[v])] += st.exc[best]
    return ch


def _local_search(st: _State, ch: np.ndarray, deadline: float) -> tuple[np.ndarray, int]:
    """Iterated best response on independent sets; returns the plan and the rounds run."""
    f = st.f
    node_of, off = f.node_of, f.off
    U = st.usage(ch) if st.mem is not None else None
    is_free = st.red.fixed < 0
    rounds = 0
    while time.perf_counter() < deadline:
        rounds += 1
        raw = st.scores(ch)
        cur = raw[ch]
        sc = raw
        if U is not None:
            room = st.cap - (_range_max(U, st.lo, st.hi) - st.exc[ch])  # own excess removed
            sc = np.where(st.exc <= room[node_of], raw, math.inf)
            sc[ch] = cur
        best_val = np.minimum.reduceat(sc, off[:-1])
        gain = cur - best_val
        cand = (gain > 1e-12 * np.maximum(np.abs(cur), 1.0)) & is_free
        if not cand.any():
            break
        # independent set: a candidate moves unless a candidate neighbour gains more
        blocked = np.zeros(f.n, bool)
        both = cand[st.eu] & cand[st.ev]
        u, v = st.eu[both], st.ev[both]
        u_wins = (gain[u] > gain[v]) | ((gain[u] == gain[v]) & (u < v))
        blocked[v[u_wins]] = True
        blocked[u[~u_wins]] = True
        move = cand & ~blocked
        g = np.flatnonzero((sc == best_val[node_of]) & move[node_of])[::-1]
        first = np.full(f.n, -1, np.int64)
        first[node_of[g]] = g  # reversed: the lowest index wins
        movers = np.flatnonzero(move)
        new = first[movers]
        if U is None:
            ch[movers] = new
            continue
        delta = st.exc[new] - st.exc[ch[movers]]
        down = delta <= 0
        vd = movers[down]
        ch[vd] = new[down]
        diff = np.zeros(U.size + 1)
        np.add.at(diff, st.lo[vd], delta[down])
        np.add.at(diff, st.hi[vd], -delta[down])
        U += np.cumsum(diff)[:U.size]
        for v, g_new, d in zip(movers[~down].tolist(), new[~down].tolist(), delta[~down].tolist()):
            lo, hi = int(st.lo[v]), int(st.hi[v])
            if U[lo:hi].max() + d <= st.cap:
                ch[v] = g_new
                U[lo:hi] += d
    return ch, rounds


def _memory_repair(st: _State, ch: np.ndarray) -> np.ndarray:
    """Make ``ch`` fit memory: on over-full rows, move live nodes to cheaper-memory strategies.

    Nodes on violated rows are visited by decreasing excess; each takes its best-scoring
    strategy among those that lower its excess, until no row is over. Falls back to the
    memory-greedy construction if that is not enough.
    """
    if st.mem is None:
        return ch
    U = st.usage(ch)
    if (U <= st.cap).all():
        return ch
    f = st.f
    sc = st.scores(ch)
    cand = st.free[(st.hi[st.free] > st.lo[st.free]) & (st.exc[ch[st.free]] > 0)]
    cand = cand[np.argsort(-st.exc[ch[cand]], kind="stable")]
    for v in cand.tolist():
        lo, hi = int(st.lo[v]), int(st.hi[v])
        if U[lo:hi].max() <= st.cap:
            continue
        g0, g1 = int(f.off[v]), int(f.off[v + 1])
        cur = st.exc[ch[v]]
        s = np.where(st.exc[g0:g1] < cur, sc[g0:g1], np.inf)
        if not np.isfinite(s).any():
            continue
        g = g0 + int(np.argmin(s))
        U[lo:hi] += st.exc[g] - cur
        ch[v] = g
        if (U <= st.cap).all():
            return ch
    return _construct(st, st.free, 0.0) if (U > st.cap).any() else ch


def _improve_blocks(st: _State, ch: np.ndarray, deadline: float, rng: np.random.Generator,
                    stats: dict, patience: int | None = None) -> np.ndarray:
    """Alternate forest DP block moves (with memory prices) and local search polishing."""
    obj = st.objective(ch)
    R = st.base.size if st.mem is not None else 0
    price = np.zeros(R)
    fin = st.cost[np.isfinite(st.cost)]
    cscale = float(np.abs(fin).mean()) if fin.size else 1.0
    escale = float(st.exc[st.exc > 0].mean()) if R and (st.exc > 0).any() else 1.0
    eta = cscale / escale ** 2
    if patience is None:  # consecutive non-improving block moves before giving up
        patience = int(min(200, 8 + st.eu.size // 4))
    fails = 0
    while fails < patience and time.perf_counter() < deadline:
        forest = random_forest(st, rng)
        extra = None
        if R:
            P = np.concatenate([[0.0], np.cumsum(price)])
            node_price = P[st.hi] - P[st.lo]
            extra = st.exc * node_price[st.f.node_of]
        new = forest_dp(st, ch, forest, extra)
        stats["dp"] = stats.get("dp", 0) + 1
        if R:
            over = st.usage(new) - st.cap
            if (over > 0).any():
                price += eta * np.maximum(over, 0.0)
                eta *= 2.0
                stats["dp_memory_rejects"] = stats.get("dp_memory_rejects", 0) + 1
                fails += 1
                continue
        new, _ = _local_search(st, new, deadline)
        nobj = st.objective(new)
        if nobj < obj - 1e-12 * max(abs(obj), 1.0):
            ch, obj, fails = new, nobj, 0
        else:
            fails += 1
    return ch


def heuristic_plan(red: Reduced, mem: MemoryRows | None, limit: float | None,
                   time_limit: float = 5.0, seed: int = 0,
                   start: str = "both") -> tuple[np.ndarray | None, dict]:
    """A feasible plan (local strategy per node) of the presolved problem, or None.

    ``mem`` are the memory rows for ``limit`` (:func:`autoshard._memory.memory_rows`).
    None when no plan without forbidden edge entries was found (or the minimum-memory
    plan does not fit). Also returns stats (rounds, seconds, penalized objective).
    """
    t0 = time.perf_counter()
    deadline = t0 + time_limit
    st = _State(red, mem, limit)
    f = red.flat
    rng = np.random.default_rng(seed)
    if st.mem is not None and st.base.max(initial=-math.inf) > st.cap:
        return None, dict(seconds=time.perf_counter() - t0, reason="minimum memory exceeds limit")
    stats = dict(starts=0, rounds=0)
    best, best_obj = None, math.inf
    kinds = ("greedy", "tree") if start == "both" else (start,)
    for i, kind in enumerate(kinds):
        part = t0 + time_limit * (i + 1) / len(kinds)
        if kind == "tree":
            forest = random_forest(st, rng, full=True)
            ch = forest_dp(st, f.off[:-1] + np.maximum(red.fixed, 0), forest,
                           row_min(st, forest.non_tree))
            ch = _memory_repair(st, ch)
        else:
            ch = _construct(st, st.free, 0.0)
        ch, rounds = _local_search(st, ch, part)
        stats["rounds"] += rounds
        stats[f"{kind}_start"] = st.objective(ch)
        ch = _improve_blocks(st, ch, part, rng, stats)
        obj = st.objective(ch)
        stats[f"{kind}_final"] = obj
        if obj < best_obj:
            best, best_obj = ch, obj
    ch = best
    obj = st.objective(ch)
    stats.update(seconds=time.perf_counter() - t0, objective=obj)
    if obj >= st.big or not np.isfinite(obj):
        return None, stats
    return ch - f.off[:-1], stats
