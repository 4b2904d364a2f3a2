"""Neighbourhoods for large-neighbourhood search and the sub-problem of one.

A neighbourhood is a set ``S`` of compact nodes; :func:`sub_compact` builds the problem
of choosing their strategies with every other node fixed at the current plan ``x``:
edges to fixed nodes fold into node costs, memory becomes one row per *segment* (the
pieces of the timeline between the starts and ends of ``S``'s memory terms), whose
constant is the fullest row of the segment minus ``S``'s own current share. Segments
that cannot overflow whatever ``S`` picks are dropped. Solving the sub-problem exactly
gives the best plan that differs from ``x`` only on ``S``.

Neighbourhoods: a BFS *ball* around a seed node (random expansion order), a *window*
of the liveness timeline (nodes holding memory at a chosen row, grown by BFS), and the
nodes *binding* the plan's memory (holding memory on the rows at the limit).
"""
from __future__ import annotations

import numpy as np

from autoshard.solver._compact import Compact, _offsets
from autoshard.solver._space import RangeMax, Space

__all__ = ["sub_compact", "ball", "window", "binding", "holding", "size_of"]


def _ranges(start: np.ndarray, stop: np.ndarray) -> np.ndarray:
    cnt = stop - start
    return np.repeat(start, cnt) + np.arange(int(cnt.sum())) - np.repeat(_offsets(cnt)[:-1], cnt)


def size_of(space: Space, S: np.ndarray, inS: np.ndarray) -> int:
    """Variables of the sub-MIP on ``S``: strategies plus internal edge entries."""
    e = space.nbr_edge[_ranges(space.nptr[S], space.nptr[S + 1])]
    e = np.unique(e[inS[space.eu[e]] & inS[space.ev[e]]])
    return int(space.k[S].sum() + np.sum(space.ebase[e + 1] - space.ebase[e]))


def sub_compact(space: Space, S: np.ndarray, x: np.ndarray, U: np.ndarray | None,
                rmax: RangeMax | None) -> Compact:
    """The problem of re-choosing the strategies of nodes ``S`` (sorted) given ``x``."""
    S = np.sort(np.asarray(S, np.int64))
    n = S.size
    inS = np.zeros(space.n, bool)
    inS[S] = True
    newid = np.full(space.n, -1, np.int64)
    newid[S] = np.arange(n)
    kS = space.k[S]
    offS = _offsets(kS)
    gS = _ranges(space.off[S], space.off[S + 1])
    pos = np.full(int(space.off[-1]), -1, np.int64)
    pos[gS] = np.arange(gS.size)
    ent = _ranges(space.ip[S], space.ip[S + 1])
    oth = space.other[ent]
    out = ~inS[oth]
    vals = space.W[space.static[ent] + x[oth] * space.mult[ent]]
    cost = space.cost[gS] + np.bincount(pos[space.tgt[ent][out]], weights=vals[out], minlength=gS.size)
    e = np.unique(space.nbr_edge[_ranges(space.nptr[S], space.nptr[S + 1])])
    e = e[inS[space.eu[e]] & inS[space.ev[e]]]
    W = space.W[_ranges(space.ebase[e], space.ebase[e + 1])]
    eu, ev = newid[space.eu[e]], newid[space.ev[e]]
    limit, base = None, np.zeros(0)
    tg = tlo = thi = tv = np.zeros(0, np.int64)
    tcoef = np.zeros(0)
    if space.limit is not None and U is not None:
        t = space.terms_of(gS)
        if t.size:
            lo, hi, coef, g = space.t_lo[t], space.t_hi[t], space.t_coef[t], space.t_g[t]
            bp = np.unique(np.concatenate([lo, hi]))
            ls, hs = np.searchsorted(bp, lo), np.searchsorted(bp, hi)
            cur = g == (space.off[:-1] + x)[space.node_of[g]]
            nseg = bp.size - 1
            d_cur, d_all = np.zeros(nseg + 1), np.zeros(nseg + 1)
            np.add.at(d_cur, ls[cur], coef[cur])
            np.add.at(d_cur, hs[cur], -coef[cur])
            np.add.at(d_all, ls, coef)
            np.add.at(d_all, hs, -coef)
            seg_base = rmax(bp[:-1], bp[1:]) - np.cumsum(d_cur)[:-1]
            keep = np.flatnonzero(seg_base + np.cumsum(d_all)[:-1] > space.limit)
            if keep.size:
                a, b = np.searchsorted(keep, ls), np.searchsorted(keep, hs)
                ok = a < b
                limit, base = space.limit, seg_base[keep]
                tg, tcoef, tlo, thi, tv = pos[g[ok]], coef[ok], a[ok], b[ok], space.t_v[t][ok]
    vmap = np.arange(gS.size) - np.repeat(offS[:-1], kS)
    return Compact(n, kS, offS, cost, 0.0, eu, ev, _offsets(kS[eu] * kS[ev]), W, limit, base,
                   tg, tcoef, tlo, thi, tv, np.arange(n), np.full(n, -1, np.int64), offS, vmap)


def _add_cost(space: Space, v: int, inS: np.ndarray) -> int:
    """Variables that adding node ``v`` to ``S`` brings: its strategies and its edges
    into ``S``."""
    add = int(space.k[v])
    for w, ed in zip(space.nbr[space.nptr[v]:space.nptr[v + 1]].tolist(),
                     space.nbr_edge[space.nptr[v]:space.nptr[v + 1]].tolist()):
        if inS[w]:
            add += int(space.ebase[ed + 1] - space.ebase[ed])
    return add


def ball(space: Space, seed: int, budget: int, rng: np.random.Generator,
         allowed: np.ndarray | None = None) -> np.ndarray:
    """Nodes reached by a randomized BFS from ``seed`` until ``budget`` variables."""
    inS = np.zeros(space.n, bool)
    inS[seed] = True
    over = np.zeros(space.n, bool)  # neighbours of S left out: they do not fit the budget
    S, frontier = [seed], [seed]
    used = int(space.k[seed])
    while frontier and used < budget:
        nxt = []
        for u in frontier:
            nb = space.nbr[space.nptr[u]:space.nptr[u + 1]]
            for i in rng.permutation(nb.size).tolist():
                v = int(nb[i])
                if inS[v] or (allowed is not None and not allowed[v]):
                    continue
                add = _add_cost(space, v, inS)
                if used + add > budget:
                    over[v] = True
                    continue
                inS[v] = True
                S.append(v)
                nxt.append(v)
                used += add
        rng.shuffle(nxt)
        frontier = nxt
        if not frontier and used < budget:  # component exhausted: jump to another one
            rest = np.flatnonzero(~inS & ~over if allowed is None else (~inS & ~over & allowed))
            rest = rest[space.k[rest] <= budget - used]  # not adjacent to S: no edge entries
            if rest.size:
                v = int(rng.choice(rest))
                inS[v] = True
                S.append(v)
                frontier = [v]
                used += int(space.k[v])
    return np.asarray(S, np.int64)


def holding(space: Space, rows: np.ndarray) -> np.ndarray:
    """Mask of the nodes with a memory term (of any strategy) on a row of the mask
    ``rows``."""
    count = np.concatenate([[0], np.cumsum(rows)])  # rows in [t_lo, t_hi) per term
    out = np.zeros(space.n, bool)
    out[space.node_of[space.t_g[count[space.t_hi] - count[space.t_lo] > 0]]] = True
    return out


def _within(space: Space, live: np.ndarray, budget: int, rng: np.random.Generator) -> np.ndarray:
    """A BFS ball inside ``live`` from a random member, then other members in random
    order, up to ``budget`` variables (a ball anywhere if ``live`` is empty)."""
    if live.size == 0:
        return ball(space, int(rng.integers(space.n)), budget, rng)
    allowed = np.zeros(space.n, bool)
    allowed[live] = True
    S = ball(space, int(rng.choice(live)), budget, rng, allowed)
    inS = np.zeros(space.n, bool)
    inS[S] = True
    used = size_of(space, S, inS)
    for v in rng.permutation(live).tolist():  # live nodes the seed's ball did not reach
        if inS[v]:
            continue
        add = _add_cost(space, v, inS)
        if used + add > budget:
            continue
        inS[v] = True
        used += add
    return np.flatnonzero(inS)


def window(space: Space, row: int, budget: int, rng: np.random.Generator) -> np.ndarray:
    """Nodes holding memory at ``row``, in random order, then a BFS ball, up to ``budget``."""
    rows = np.zeros(space.compact.R, bool)
    rows[row] = True
    return _within(space, np.flatnonzero(holding(space, rows)), budget, rng)


def binding(space: Space, U: np.ndarray, budget: int, rng: np.random.Generator,
            tol: float = 1e-3) -> np.ndarray:
    """Every node holding memory on a row within ``tol`` (relative) of the limit, or on
    the fullest row if none is; a random part of them when they exceed ``budget``.

    Re-solved over each node's best few strategies, this trades memory among all the
    nodes a full row couples (IOPDDL M after the kernel jump: 948 nodes on 2 rows at
    the limit, 4.99293e10 to 4.99176e10 with node and pair moves after it)."""
    rows = U >= space.limit * (1.0 - tol)
    if not rows.any():
        rows[int(np.argmax(U))] = True
    live = np.flatnonzero(holding(space, rows))
    inS = np.zeros(space.n, bool)
    inS[live] = True
    if live.size and size_of(space, live, inS) <= budget:
        return live
    return _within(space, live, budget, rng)
