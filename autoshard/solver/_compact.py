"""The compact problem the anytime search and the exact sub-solvers work on.

A :class:`Compact` is a presolved strategy problem in flat numpy arrays, where one
compact node may stand for several original nodes (bijection contraction,
:mod:`autoshard.solver._contract`): compact strategy ``j`` of node ``c`` fixes every member
``v`` to ``vmap[vmap_off[v] + j]``. Edges are dense row-major blocks (``inf``:
forbidden pair). Memory is a list of *terms*: global strategy ``tg`` adds ``tcoef`` to
every kept memory row in ``[tlo, thi)`` (a member's excess over its minimum); rows carry
the constant ``base``; a plan fits when ``base + sum of its terms <= limit`` on every row.

Operations here keep the optimum: :func:`restrict` (drop strategies), :func:`fold_fixed`
(single-strategy nodes become constants), :func:`arc_consistency`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from autoshard.solver._memory import MemoryRows
from autoshard.solver._presolve import Reduced

__all__ = ["Compact", "from_reduced", "restrict", "fold_fixed", "arc_consistency", "simplify",
           "plan_of", "x_of", "objective", "usage", "entry_index", "memory_ok", "Infeasible"]


class Infeasible(Exception):
    """Every strategy of some node was removed: no plan with finite cost exists."""


@dataclass(frozen=True, slots=True)
class Compact:
    n: int
    k: np.ndarray          # (n,) strategies per node
    off: np.ndarray        # (n+1,)
    cost: np.ndarray       # (G,)
    const: float
    eu: np.ndarray         # (m,) eu < ev
    ev: np.ndarray
    ebase: np.ndarray      # (m+1,) block offsets into W
    W: np.ndarray          # dense ku x kv blocks, row-major
    limit: float | None
    base: np.ndarray       # (R,) constant memory of each kept row
    tg: np.ndarray         # (T,) memory terms: global strategy, excess, row range
    tcoef: np.ndarray
    tlo: np.ndarray
    thi: np.ndarray
    tv: np.ndarray         # (T,) original node of each term
    comp: np.ndarray       # (n0,) compact node of each original node, -1: fixed
    fixed0: np.ndarray     # (n0,) original local strategy of fixed nodes, else -1
    vmap_off: np.ndarray   # (n0+1,)
    vmap: np.ndarray       # original local strategy per (original node, compact strategy)

    @property
    def node_of(self) -> np.ndarray:
        return np.repeat(np.arange(self.n), self.k)

    @property
    def m(self) -> int:
        return int(self.eu.size)

    @property
    def R(self) -> int:
        return int(self.base.size)


def _offsets(sizes: np.ndarray) -> np.ndarray:
    out = np.zeros(sizes.size + 1, np.int64)
    np.cumsum(sizes, out=out[1:])
    return out


def entry_index(k: np.ndarray, off: np.ndarray, eu: np.ndarray, ev: np.ndarray,
                ebase: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every block entry: (edge, row's global strategy, column's global strategy)."""
    size = np.diff(ebase)
    e = np.repeat(np.arange(size.size), size)
    i = np.arange(int(ebase[-1])) - ebase[e]
    kv = k[ev][e]
    return e, off[eu][e] + i // kv, off[ev][e] + i % kv


def from_reduced(red: Reduced, mem: MemoryRows | None, limit: float | None) -> Compact:
    """One compact node per free node of ``red``; its strategies are the allowed ones."""
    f = red.flat
    na = np.bincount(f.node_of, weights=red.allowed, minlength=f.n).astype(np.int64)
    free = (red.fixed < 0) & (na > 0)
    comp = np.full(f.n, -1, np.int64)
    comp[free] = np.arange(int(free.sum()))
    gsel = np.flatnonzero(red.allowed & free[f.node_of])
    k = na[free]
    off = _offsets(k)
    inv = np.full(red.cost.size, -1, np.int64)
    inv[gsel] = np.arange(gsel.size)
    # kept edges: endpoints from their entries (A's node < B's node)
    m = red.num_edges
    eu, ev = np.zeros(m, np.int64), np.zeros(m, np.int64)
    eu[red.edge], ev[red.edge] = comp[f.node_of[red.A]], comp[f.node_of[red.B]]
    ebase = _offsets(k[eu] * k[ev])
    W = np.full(int(ebase[-1]), math.inf)
    ju, jv = inv[red.A] - off[eu[red.edge]], inv[red.B] - off[ev[red.edge]]
    W[ebase[red.edge] + ju * k[ev[red.edge]] + jv] = red.c
    if mem is not None and limit is not None and mem.num_rows:
        ok = inv[mem.g] >= 0
        tg, tcoef, tlo, thi = inv[mem.g[ok]], mem.coef[ok], mem.lo[ok], mem.hi[ok]
        tv = f.node_of[mem.g[ok]]
        base = mem.base.copy()
    else:
        tg = tlo = thi = tv = np.zeros(0, np.int64)
        tcoef, base = np.zeros(0), np.zeros(0)
    vk = np.where(free, na, 0)
    vmap_off = _offsets(vk)
    vmap = gsel - np.repeat(f.off[:-1], vk)  # gsel is sorted by node: segments line up
    fixed0 = np.where(free, -1, red.fixed)
    return Compact(int(k.size), k, off, red.cost[gsel].astype(np.float64), float(red.const),
                   eu, ev, ebase, W, limit if tg.size else None, base, tg, tcoef, tlo, thi,
                   tv, comp, fixed0, vmap_off, vmap)


def restrict(compact: Compact, keep: np.ndarray) -> Compact:
    """Keep only strategies with ``keep[g]``; raises :class:`Infeasible` if a node loses all."""
    if keep.all():
        return compact
    k2 = np.bincount(compact.node_of, weights=keep, minlength=compact.n).astype(np.int64)
    if (k2 == 0).any():
        raise Infeasible(f"compact node {int(np.argmin(k2))} has no strategy left")
    off2 = _offsets(k2)
    new = np.cumsum(keep) - 1
    _, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    W2 = compact.W[keep[r] & keep[c]]
    tk = keep[compact.tg]
    # vmap: original node v keeps the entries of its compact node's kept strategies
    v_of = np.repeat(np.arange(compact.comp.size), np.diff(compact.vmap_off))
    j = np.arange(compact.vmap.size) - compact.vmap_off[v_of]
    vkeep = keep[compact.off[compact.comp[v_of]] + j] if compact.vmap.size else np.zeros(0, bool)
    vk2 = np.where(compact.comp >= 0, k2[np.maximum(compact.comp, 0)], 0)
    return replace(compact, k=k2, off=off2, cost=compact.cost[keep],
                   ebase=_offsets(k2[compact.eu] * k2[compact.ev]),
                   W=W2, tg=new[compact.tg[tk]], tcoef=compact.tcoef[tk], tlo=compact.tlo[tk],
                   thi=compact.thi[tk],
                   tv=compact.tv[tk], vmap_off=_offsets(vk2), vmap=compact.vmap[vkeep])


def arc_consistency(compact: Compact) -> np.ndarray:
    """Strategies with finite cost and a finite entry against a kept partner on every edge."""
    keep = np.isfinite(compact.cost)
    if compact.m == 0:
        return keep
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    fin = np.isfinite(compact.W)
    ku, kv = compact.k[compact.eu], compact.k[compact.ev]
    rb, cb = _offsets(ku), _offsets(kv)
    rid = rb[e] + r - compact.off[compact.eu][e]
    cid = cb[e] + c - compact.off[compact.ev][e]
    row_g = np.repeat(compact.off[compact.eu], ku) + np.arange(int(rb[-1])) - np.repeat(rb[:-1], ku)
    col_g = np.repeat(compact.off[compact.ev], kv) + np.arange(int(cb[-1])) - np.repeat(cb[:-1], kv)
    while True:
        ok = fin & keep[r] & keep[c]
        rs = np.bincount(rid, weights=ok, minlength=int(rb[-1])) > 0
        cs = np.bincount(cid, weights=ok, minlength=int(cb[-1])) > 0
        kill = np.concatenate([row_g[~rs], col_g[~cs]])
        kill = kill[keep[kill]]
        if kill.size == 0:
            return keep
        keep[kill] = False


def fold_fixed(compact: Compact) -> Compact:
    """Nodes with one strategy become constants (costs, edges into neighbours, memory to base)."""
    one = compact.k == 1
    if not one.any():
        return compact
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    fu, fv = one[compact.eu][e], one[compact.ev][e]
    cost = compact.cost.copy()
    const = compact.const + float(np.sum(compact.cost[compact.off[:-1][one]]))
    const += float(np.sum(compact.W[fu & fv]))
    np.add.at(cost, c[fu & ~fv], compact.W[fu & ~fv])
    np.add.at(cost, r[fv & ~fu], compact.W[fv & ~fu])
    base = compact.base.copy()
    tf = one[compact.node_of[compact.tg]] if compact.tg.size else np.zeros(0, bool)
    if tf.any():
        diff = np.zeros(compact.R + 1)
        np.add.at(diff, compact.tlo[tf], compact.tcoef[tf])
        np.add.at(diff, compact.thi[tf], -compact.tcoef[tf])
        base += np.cumsum(diff)[:-1]
    keep_n = ~one
    newid = np.cumsum(keep_n) - 1
    keep_e = keep_n[compact.eu] & keep_n[compact.ev]
    keep_g = keep_n[compact.node_of]
    # original nodes of folded compact nodes get their (single) strategy
    comp, fixed0 = compact.comp.copy(), compact.fixed0.copy()
    vin = (comp >= 0) & one[np.maximum(comp, 0)]
    fixed0[vin] = compact.vmap[compact.vmap_off[:-1][vin]]
    comp[vin] = -1
    comp[comp >= 0] = newid[comp[comp >= 0]]
    v_of = np.repeat(np.arange(compact.comp.size), np.diff(compact.vmap_off))
    vk = np.diff(compact.vmap_off) * ~vin
    k2 = compact.k[keep_n]
    tk = ~tf
    return replace(compact, n=int(k2.size), k=k2, off=_offsets(k2), cost=cost[keep_g], const=const,
                   eu=newid[compact.eu[keep_e]], ev=newid[compact.ev[keep_e]],
                   ebase=_offsets(k2[newid[compact.eu[keep_e]]] * k2[newid[compact.ev[keep_e]]]),
                   W=compact.W[keep_e[e]], base=base,
                   tg=(np.cumsum(keep_g) - 1)[compact.tg[tk]], tcoef=compact.tcoef[tk], tlo=compact.tlo[tk],
                   thi=compact.thi[tk], tv=compact.tv[tk], comp=comp, fixed0=fixed0, vmap_off=_offsets(vk),
                   vmap=compact.vmap[~vin[v_of]])


def simplify(compact: Compact) -> Compact:
    """Arc consistency and folding of single-strategy nodes until nothing changes."""
    while True:
        compact = restrict(compact, arc_consistency(compact))
        if not (compact.k == 1).any():
            return compact
        compact = fold_fixed(compact)


def plan_of(compact: Compact, x: np.ndarray) -> np.ndarray:
    """The original plan (local strategy per original node) of compact choice ``x``."""
    plan = compact.fixed0.copy()
    v = np.flatnonzero(compact.comp >= 0)
    plan[v] = compact.vmap[compact.vmap_off[v] + x[compact.comp[v]]]
    return plan


def x_of(compact: Compact, plan: np.ndarray) -> np.ndarray | None:
    """The compact choice matching an original plan, or None if no compact plan gives it."""
    x = np.full(compact.n, -1, np.int64)
    v_of = np.repeat(np.arange(compact.comp.size), np.diff(compact.vmap_off))
    j = np.arange(compact.vmap.size) - compact.vmap_off[v_of]
    hit = compact.vmap == np.asarray(plan)[v_of]
    # a compact strategy matches when every member agrees
    g = compact.off[compact.comp[v_of]] + j
    members = np.bincount(compact.comp[compact.comp >= 0], minlength=compact.n)
    agree = np.bincount(g[hit], minlength=int(compact.off[-1]))
    full = np.flatnonzero(agree == members[compact.node_of])
    if full.size:
        x[compact.node_of[full][::-1]] = (full - compact.off[compact.node_of[full]])[::-1]
    fixed = compact.comp < 0
    if (x < 0).any() or (np.asarray(plan)[fixed] != compact.fixed0[fixed]).any():
        return None
    return x


def objective(compact: Compact, x: np.ndarray) -> float:
    """Cost of compact choice ``x`` (constant included)."""
    g = compact.off[:-1] + x
    w = compact.W[compact.ebase[:-1] + x[compact.eu] * compact.k[compact.ev] + x[compact.ev]]
    return compact.const + math.fsum(compact.cost[g].tolist()) + math.fsum(w.tolist())


def usage(compact: Compact, x: np.ndarray) -> np.ndarray:
    """Memory of every kept row under ``x``."""
    if compact.tg.size == 0:
        on = np.zeros(0, bool)
    else:
        on = (compact.off[:-1] + x)[compact.node_of[compact.tg]] == compact.tg
    diff = np.zeros(compact.R + 1)
    np.add.at(diff, compact.tlo[on], compact.tcoef[on])
    np.add.at(diff, compact.thi[on], -compact.tcoef[on])
    return compact.base + np.cumsum(diff)[:-1]


def memory_ok(compact: Compact) -> list[np.ndarray | None]:
    """Per node: ``ok[p, q]`` = no member uses more memory under q than under p."""
    out: list[np.ndarray | None] = [None] * compact.n
    if compact.tg.size == 0:
        return out
    u = compact.node_of[compact.tg]
    order = np.lexsort((compact.tv, u))
    local = compact.tg - compact.off[compact.node_of[compact.tg]]
    u, v, j, c = u[order], compact.tv[order], local[order], compact.tcoef[order]
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    ends = np.r_[starts[1:], u.size]
    for s, e in zip(starts.tolist(), ends.tolist()):
        node = int(u[s])
        _, mi = np.unique(v[s:e], return_inverse=True)
        C = np.zeros((int(mi.max()) + 1, int(compact.k[node])))
        np.add.at(C, (mi, j[s:e]), c[s:e])
        out[node] = (C[:, None, :] <= C[:, :, None]).all(axis=0)
    return out
