"""Memory rows of the strategy ILP: one per maximal set of simultaneously live nodes.

Node ``v`` is live at integer times ``start <= t < end``. With non-negative memory, the
constraint at time ``t`` is implied by the one at ``t'`` whenever ``live(t)`` is a subset of
``live(t')``, so only start times followed by an end before the next start are kept (the
maximal cliques of the interval graph). Each node's memory is split into its minimum over
allowed strategies (a constant, ``base``) and the excess ``coef`` paid through the binary
``s[g]``; rows that cannot exceed the limit even with every excess are dropped. Every node
covers a contiguous range ``[lo, hi)`` of the kept rows, which allows the incremental
(running-sum) form for large instances.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autoshard.solver._presolve import Flat

__all__ = ["MemoryRows", "memory_rows"]


@dataclass(frozen=True, slots=True)
class MemoryRows:
    times: np.ndarray   # (R,) time of each kept row
    base: np.ndarray    # (R,) memory that every plan uses at that row
    g: np.ndarray       # (T,) global strategies with an excess term
    coef: np.ndarray    # (T,) their excess over the node's minimum
    lo: np.ndarray      # (T,) first row where the strategy's node is live
    hi: np.ndarray      # (T,) one past the last one
    node_base: np.ndarray  # (n,) each node's minimum memory (0 if never in a row)
    peak_lower_bound: float  # max over all clique rows of base (before pruning)

    @property
    def num_rows(self) -> int:
        return int(self.times.size)

    def nnz_direct(self) -> int:
        return int(np.sum(self.hi - self.lo))


def _clique_times(starts: np.ndarray, ends: np.ndarray, nonneg: bool) -> np.ndarray:
    if not nonneg:
        return np.unique(np.concatenate([starts, ends]))
    s = np.unique(starts)
    e = np.sort(ends)
    nxt = np.append(s[1:], np.iinfo(np.int64).max)
    ended = np.searchsorted(e, nxt, "right") - np.searchsorted(e, s, "right")
    return s[ended > 0]


def memory_rows(f: Flat, allowed: np.ndarray, limit: float | None) -> MemoryRows:
    """Kept memory rows; ``limit=None`` keeps every clique row (for min-peak solves)."""
    live = f.iv[:, 0] < f.iv[:, 1]
    mem = np.where(allowed, f.mem, np.nan)
    with np.errstate(all="ignore"):
        mn = np.fmin.reduceat(mem, f.off[:-1]) if f.n else np.zeros(0)
        mx = np.fmax.reduceat(mem, f.off[:-1]) if f.n else np.zeros(0)
    mn, mx = np.nan_to_num(mn), np.nan_to_num(mx)  # nodes without strategies: 0
    rel = live & ((mn != 0) | (mx != 0))
    nonneg = bool((mem[rel[f.node_of]] >= 0).all()) if f.n else True
    times = _clique_times(f.iv[rel, 0], f.iv[rel, 1], nonneg)
    a = np.searchsorted(times, f.iv[:, 0], "left")
    b = np.searchsorted(times, f.iv[:, 1], "left")
    a, b = np.where(rel, a, 0), np.where(rel, b, 0)
    R = times.size
    diff = np.zeros(R + 1)
    np.add.at(diff, a, mn * rel)
    np.add.at(diff, b, -mn * rel)
    base = np.cumsum(diff)[:R]
    peak_lb = float(base.max()) if R else 0.0
    excess = np.where(allowed, f.mem - mn[f.node_of], 0.0)
    keep = np.arange(R)
    if limit is not None:
        diff[:] = 0
        extra = np.where(rel, mx - mn, 0.0)
        np.add.at(diff, a, extra)
        np.add.at(diff, b, -extra)
        maxuse = base + np.cumsum(diff)[:R]
        keep = np.flatnonzero(maxuse > limit + 1e-9 * abs(limit))
    lo, hi = np.searchsorted(keep, a), np.searchsorted(keep, b)
    term = allowed & rel[f.node_of] & (excess != 0) & (lo < hi)[f.node_of]
    g = np.flatnonzero(term)
    v = f.node_of[g]
    return MemoryRows(times[keep], base[keep], g, excess[g], lo[v], hi[v],
                      np.where(rel, mn, 0.0), peak_lb)
