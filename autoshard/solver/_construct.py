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


def construct(space: Space, order: np.ndarray | None = None, weight: float = 0.0) -> np.ndarray:
    """A plan (local strategy per compact node) built greedily in ``order``."""
    n = space.n
    order = np.arange(n) if order is None else order
    x = np.zeros(n, np.int64)
    decided = np.zeros(n, bool)
    U = space.compact.base.copy() if space.limit is not None else None
    for u in order.tolist():
        g0, g1 = int(space.off[u]), int(space.off[u + 1])
        score = space.cost[g0:g1].copy()
        a, b = int(space.ip[u]), int(space.ip[u + 1])
        if b > a:
            o = space.other[a:b]
            dec = decided[o]
            if dec.any():
                vals = space.W[space.static[a:b][dec] + x[o[dec]] * space.mult[a:b][dec]]
                score += np.bincount(space.tgt[a:b][dec] - g0, weights=vals, minlength=g1 - g0)
        if U is not None:
            t0, t1 = int(space.tptr[g0]), int(space.tptr[g1])
            if t1 > t0:
                lo, hi, c = space.t_lo[t0:t1], space.t_hi[t0:t1], space.t_coef[t0:t1]
                j = space.t_g[t0:t1] - g0
                bp = np.unique(np.concatenate([lo, hi]))
                seg_max = np.maximum.reduceat(U[bp[0]:bp[-1]], bp[:-1] - bp[0])
                ls, hs = np.searchsorted(bp, lo), np.searchsorted(bp, hi)
                prof = np.zeros((g1 - g0, bp.size))
                np.add.at(prof, (j, ls), c)
                np.add.at(prof, (j, hs), -c)
                over = (np.cumsum(prof, axis=1)[:, :-1] + seg_max[None, :]).max(axis=1) - space.limit
                fits = over <= 0
                if weight:
                    score = score + weight * np.bincount(j, weights=c * (hi - lo), minlength=g1 - g0)
                score = np.where(fits, score, math.inf) if fits.any() else over
        q = int(np.argmin(score))
        x[u] = q
        decided[u] = True
        if U is not None:
            t = np.arange(int(space.tptr[g0 + q]), int(space.tptr[g0 + q + 1]))
            for lo_, hi_, c_ in zip(space.t_lo[t].tolist(), space.t_hi[t].tolist(), space.t_coef[t].tolist()):
                U[lo_:hi_] += c_
    return x


def start_plan(compact: Compact, space: Space) -> np.ndarray | None:
    """A plan of finite cost that fits memory: greedy, then greedy weighing memory more and
    more (cost per byte-row scaled to the largest node cost); None if none fits."""
    largest_term = float(space.t_coef.max()) if space.t_coef.size else 1.0
    scale = (float(np.abs(compact.cost).max()) or 1.0) / max(largest_term, 1.0)
    for weight in (0.0, 1e-3 * scale, scale):
        x = construct(space, weight=weight)
        fits = space.limit is None or (space.usage(x) <= space.limit).all()
        if math.isfinite(objective(compact, x)) and fits:
            return x
    return None
