"""Memory-aware greedy construction of a compact plan (the search's start).

Nodes are decided in a given order (by default their index, which follows the original
node order: roughly topological in XLA dumps, so each node sees its producers decided).
A node takes the strategy with the least node cost plus edge cost to decided neighbours
(``+ weight * memory``) among those whose memory terms fit the rows they cover given
what is decided so far (undecided members count at their minimum, i.e. not at all).
If no strategy fits, the one with the least overflow is taken; the caller repairs.
"""
from __future__ import annotations

import math

import numpy as np

from autoshard.solver._compact import Compact, objective
from autoshard.solver._space import Space

__all__ = ["construct", "start_plan"]


def construct(sp: Space, order: np.ndarray | None = None, weight: float = 0.0) -> np.ndarray:
    """A plan (local strategy per compact node) built greedily in ``order``."""
    n = sp.n
    order = np.arange(n) if order is None else order
    x = np.zeros(n, np.int64)
    decided = np.zeros(n, bool)
    U = sp.cp.base.copy() if sp.limit is not None else None
    for u in order.tolist():
        g0, g1 = int(sp.off[u]), int(sp.off[u + 1])
        score = sp.cost[g0:g1].copy()
        a, b = int(sp.ip[u]), int(sp.ip[u + 1])
        if b > a:
            o = sp.other[a:b]
            dec = decided[o]
            if dec.any():
                vals = sp.W[sp.static[a:b][dec] + x[o[dec]] * sp.mult[a:b][dec]]
                score += np.bincount(sp.tgt[a:b][dec] - g0, weights=vals, minlength=g1 - g0)
        if U is not None:
            t0, t1 = int(sp.tptr[g0]), int(sp.tptr[g1])
            if t1 > t0:
                lo, hi, c = sp.t_lo[t0:t1], sp.t_hi[t0:t1], sp.t_coef[t0:t1]
                j = sp.t_g[t0:t1] - g0
                bp = np.unique(np.concatenate([lo, hi]))
                seg_max = np.maximum.reduceat(U[bp[0]:bp[-1]], bp[:-1] - bp[0])
                ls, hs = np.searchsorted(bp, lo), np.searchsorted(bp, hi)
                prof = np.zeros((g1 - g0, bp.size))
                np.add.at(prof, (j, ls), c)
                np.add.at(prof, (j, hs), -c)
                over = (np.cumsum(prof, axis=1)[:, :-1] + seg_max[None, :]).max(axis=1) - sp.limit
                fits = over <= 0
                if weight:
                    score = score + weight * np.bincount(j, weights=c * (hi - lo), minlength=g1 - g0)
                score = np.where(fits, score, math.inf) if fits.any() else over
        q = int(np.argmin(score))
        x[u] = q
        decided[u] = True
        if U is not None:
            t = np.arange(int(sp.tptr[g0 + q]), int(sp.tptr[g0 + q + 1]))
            for lo_, hi_, c_ in zip(sp.t_lo[t].tolist(), sp.t_hi[t].tolist(), sp.t_coef[t].tolist()):
                U[lo_:hi_] += c_
    return x


def start_plan(cp: Compact, sp: Space) -> np.ndarray | None:
    """A plan of finite cost that fits memory: greedy, then greedy weighing memory more and
    more (cost per byte-row scaled to the largest node cost); None if none fits."""
    scale = (float(np.abs(cp.cost).max()) or 1.0) / max(float(sp.t_coef.max()) if sp.t_coef.size else 1.0, 1.0)
    for weight in (0.0, 1e-3 * scale, scale):
        x = construct(sp, weight=weight)
        if math.isfinite(objective(cp, x)) and (sp.limit is None or (sp.usage(x) <= sp.limit).all()):
            return x
    return None
