"""Search-side view of a :class:`~autoshard.solver._compact.Compact`: incidence, adjacency, memory.

``Space`` precomputes, once per problem, what the local moves need in flat arrays:
- one *incidence entry* per (edge, side, strategy of that side), so the score of every
  strategy given the other nodes' choices is one gather and one ``bincount``;
- node adjacency (CSR) for growing neighbourhoods;
- memory terms grouped by strategy (CSR), for exact usage updates of a move;
- per node, which moves never raise any member's memory (``safe``).
"""
from __future__ import annotations

import math

import numpy as np

from autoshard.solver._compact import Compact, _offsets, entry_index, memory_ok

__all__ = ["Space", "RangeMax"]


class RangeMax:
    """max(U[a:b]) for many ranges at once (sparse table, O(R log R) to build)."""

    def __init__(self, U: np.ndarray) -> None:
        self.table = [U]
        j = 1
        while 2 * j <= U.size:
            prev = self.table[-1]
            self.table.append(np.maximum(prev[:-j], prev[j:]))
            j *= 2

    def __call__(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        out = np.full(a.size, -math.inf)
        ok = b > a
        if not ok.any():
            return out
        a, b = a[ok], b[ok]
        lvl = np.floor(np.log2(b - a)).astype(np.int64)
        res = np.empty(a.size)
        for L in np.unique(lvl).tolist():
            s = lvl == L
            t = self.table[L]
            res[s] = np.maximum(t[a[s]], t[b[s] - (1 << L)])
        out[ok] = res
        return out


class Space:
    """Precomputed arrays of ``compact`` (see module docstring)."""

    def __init__(self, compact: Compact) -> None:
        self.compact = compact
        self.n, self.k, self.off, self.node_of = compact.n, compact.k, compact.off, compact.node_of
        self.cost, self.W = compact.cost, compact.W
        self.eu, self.ev, self.ebase = compact.eu, compact.ev, compact.ebase
        self.free_mask = np.ones(compact.n, bool)
        self.limit = compact.limit if (compact.limit is not None and compact.R) else None
        k, m = compact.k, compact.m
        ku, kv = k[compact.eu], k[compact.ev]
        eidx_u, eidx_v = np.repeat(np.arange(m), ku), np.repeat(np.arange(m), kv)
        p = np.arange(int(ku.sum())) - np.repeat(_offsets(ku)[:-1], ku)
        q = np.arange(int(kv.sum())) - np.repeat(_offsets(kv)[:-1], kv)
        tgt = np.concatenate([compact.off[compact.eu][eidx_u] + p, compact.off[compact.ev][eidx_v] + q])
        static = np.concatenate([compact.ebase[eidx_u] + p * kv[eidx_u], compact.ebase[eidx_v] + q])
        other = np.concatenate([compact.ev[eidx_u], compact.eu[eidx_v]])
        mult = np.concatenate([np.ones(eidx_u.size, np.int64), kv[eidx_v]])
        order = np.argsort(tgt, kind="stable")
        self.tgt, self.static, self.other, self.mult = tgt[order], static[order], other[order], mult[order]
        self.ip = np.searchsorted(self.node_of[self.tgt], np.arange(compact.n + 1))
        # adjacency
        a = np.concatenate([compact.eu, compact.ev])
        b = np.concatenate([compact.ev, compact.eu])
        ed = np.concatenate([np.arange(m), np.arange(m)])
        o = np.argsort(a, kind="stable")
        self.nbr, self.nbr_edge = b[o], ed[o]
        self.nptr = np.searchsorted(a[o], np.arange(compact.n + 1))
        self.degree = np.diff(self.nptr)
        # memory terms by strategy
        o = np.argsort(compact.tg, kind="stable")
        self.t_lo, self.t_hi, self.t_coef = compact.tlo[o], compact.thi[o], compact.tcoef[o]
        self.t_g, self.t_v = compact.tg[o], compact.tv[o]
        self.tptr = np.searchsorted(self.t_g, np.arange(int(compact.off[-1]) + 1))
        # per node, safe[p, q]: moving p -> q raises no member's memory (None: all)
        self.safe = memory_ok(compact) if self.limit is not None else [None] * self.n
        # (edge, row's global strategy, column's global strategy) of every entry
        self.entries = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)

    def scores(self, x: np.ndarray) -> np.ndarray:
        """Cost of every strategy given the other nodes' choices in ``x``."""
        vals = self.W[self.static + x[self.other] * self.mult]
        return self.cost + np.bincount(self.tgt, weights=vals, minlength=self.cost.size)

    def scores_split(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`scores` as (finite part, number of forbidden terms) per strategy."""
        vals = self.W[self.static + x[self.other] * self.mult]
        bad = np.isinf(vals)
        fin = self.cost + np.bincount(self.tgt, weights=np.where(bad, 0.0, vals),
                                      minlength=self.cost.size)
        return fin, np.bincount(self.tgt, weights=bad, minlength=self.cost.size)

    def usage(self, x: np.ndarray) -> np.ndarray:
        compact = self.compact
        g = self.off[:-1] + x
        cnt = self.tptr[g + 1] - self.tptr[g]
        idx = np.repeat(self.tptr[g], cnt) + np.arange(int(cnt.sum())) - np.repeat(_offsets(cnt)[:-1], cnt)
        diff = np.zeros(compact.R + 1)
        np.add.at(diff, self.t_lo[idx], self.t_coef[idx])
        np.add.at(diff, self.t_hi[idx], -self.t_coef[idx])
        return compact.base + np.cumsum(diff)[:-1]

    def terms_of(self, g: np.ndarray) -> np.ndarray:
        """Indices (into the t_* arrays) of the memory terms of strategies ``g``."""
        cnt = self.tptr[g + 1] - self.tptr[g]
        return np.repeat(self.tptr[g], cnt) + np.arange(int(cnt.sum())) - np.repeat(_offsets(cnt)[:-1], cnt)

    def move_fits(self, U: np.ndarray, u: int, p: int, q: int) -> bool:
        """Exact: does moving node ``u`` from strategy p to q keep every row within the limit?"""
        if self.limit is None:
            return True
        tq = self.terms_of(np.array([self.off[u] + q]))
        if tq.size == 0:
            return True
        tp = self.terms_of(np.array([self.off[u] + p]))
        lo = np.concatenate([self.t_lo[tq], self.t_lo[tp]])
        hi = np.concatenate([self.t_hi[tq], self.t_hi[tp]])
        c = np.concatenate([self.t_coef[tq], -self.t_coef[tp]])
        a, b = int(lo.min()), int(hi.max())
        diff = np.zeros(b - a + 1)
        np.add.at(diff, lo - a, c)
        np.add.at(diff, hi - a, -c)
        return bool((U[a:b] + np.cumsum(diff)[:-1] <= self.limit).all())

    def apply_move(self, U: np.ndarray, u: int, p: int, q: int) -> None:
        tq = self.terms_of(np.array([self.off[u] + q]))
        tp = self.terms_of(np.array([self.off[u] + p]))
        for t, s in ((tq, 1.0), (tp, -1.0)):
            if t.size:
                diff = np.zeros(U.size + 1)
                np.add.at(diff, self.t_lo[t], s * self.t_coef[t])
                np.add.at(diff, self.t_hi[t], -s * self.t_coef[t])
                U += np.cumsum(diff)[:-1]
