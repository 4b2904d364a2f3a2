"""Presolve for the strategy ILP: flatten a :class:`Problem` into numpy arrays and shrink it.

Every strategy gets a global index ``g`` (node ``v`` owns ``off[v] .. off[v+1]-1``).
Edge cost matrices become flat entry arrays ``(A, B, cost)`` over global strategies,
oriented from the lower to the higher node id, so parallel edges (in either direction)
merge by summing equal ``(A, B)`` keys. Then, all vectorized:

1. forbid strategies with an ``inf`` cost or, when live, a memory above the limit;
2. arc consistency: forbid a strategy with no finite edge entry to an allowed partner,
   until nothing changes (``inf`` edge entries simply get no variable);
3. nodes left with one strategy become constants, folded into their neighbours' costs;
4. edges whose matrix on the allowed strategies is separable, ``c[p,q] = a[p] + b[q]``
   (all-zero and constant matrices included), fold into node costs and disappear.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from autoshard.solver.problem import Problem

__all__ = ["InvalidProblemError", "Flat", "Reduced", "flatten", "reduce"]


class InvalidProblemError(ValueError):
    """The Problem's arrays are inconsistent (lengths, shapes, NaN, edge endpoints)."""


@dataclass(frozen=True, slots=True)
class Flat:
    """A Problem as flat arrays (see module docstring)."""

    n: int
    k: np.ndarray         # (n,) strategies per node
    off: np.ndarray       # (n+1,) first global strategy of each node
    node_of: np.ndarray   # (G,) node owning global strategy g
    cost: np.ndarray      # (G,) node cost, self-loop diagonals added
    mem: np.ndarray       # (G,)
    iv: np.ndarray        # (n, 2) [start, end)
    A: np.ndarray         # (E,) merged edge entries, A's node < B's node
    B: np.ndarray
    c: np.ndarray
    pu: np.ndarray        # (m,) merged edge endpoints, entries sorted by edge then A, B
    pv: np.ndarray
    eid: np.ndarray       # (E,) merged edge of each entry
    ebase: np.ndarray     # (m,) index of the edge's first entry
    limit: float | None


@dataclass(frozen=True, slots=True)
class Reduced:
    """The presolved problem: free nodes' allowed strategies and the kept edge entries."""

    flat: Flat
    allowed: np.ndarray   # (G,) bool
    fixed: np.ndarray     # (n,) chosen local strategy of a constant node, else -1
    cost: np.ndarray      # (G,) node costs with folded edges
    const: float          # objective constant (fixed nodes and edges between them)
    A: np.ndarray         # kept (non-separable) edge entries with finite cost
    B: np.ndarray
    c: np.ndarray
    edge: np.ndarray      # kept edge id (0..num_edges-1) of each entry
    num_edges: int
    empty_nodes: np.ndarray  # nodes with no allowed strategy (infeasible if non-empty)
    stats: dict


def _validate(p: Problem) -> None:
    n = p.num_nodes
    if len(p.node_memory) != n or len(p.intervals) != n:
        raise InvalidProblemError(f"{p.name!r}: {n} node_costs, {len(p.node_memory)} node_memory, "
                                  f"{len(p.intervals)} intervals; they must match")
    if len(p.edges) != len(p.edge_costs):
        raise InvalidProblemError(f"{p.name!r}: {len(p.edges)} edges but {len(p.edge_costs)} matrices")
    for v in range(n):
        c, m = np.asarray(p.node_costs[v]), np.asarray(p.node_memory[v])
        if c.ndim != 1 or c.size == 0 or m.shape != c.shape:
            raise InvalidProblemError(f"node {v}: costs shape {c.shape} and memory shape {m.shape} "
                                      "must be equal, 1-D and non-empty")
    for j, ((u, v), c) in enumerate(zip(p.edges, p.edge_costs)):
        if not (0 <= u < n and 0 <= v < n):
            raise InvalidProblemError(f"edge {j}: endpoints ({u}, {v}) outside 0..{n - 1}")
        want = (len(p.node_costs[u]), len(p.node_costs[v]))
        if np.shape(c) != want:
            raise InvalidProblemError(f"edge {j} ({u}, {v}): cost matrix shape {np.shape(c)}, "
                                      f"expected {want}")


def flatten(p: Problem) -> Flat:
    """Validate ``p`` and build its :class:`Flat` form (parallel edges merged)."""
    _validate(p)
    n = p.num_nodes
    k = np.fromiter((len(c) for c in p.node_costs), np.int64, n)
    off = np.zeros(n + 1, np.int64)
    np.cumsum(k, out=off[1:])
    G = int(off[-1])
    node_of = np.repeat(np.arange(n), k)
    cost = np.concatenate([np.asarray(c, np.float64) for c in p.node_costs]) if n else np.zeros(0)
    mem = np.concatenate([np.asarray(m, np.float64) for m in p.node_memory]) if n else np.zeros(0)
    if np.isnan(cost).any() or not np.isfinite(mem).all():
        raise InvalidProblemError(f"{p.name!r}: node costs must not be NaN and memory must be finite")
    iv = np.asarray(p.intervals, np.int64).reshape(n, 2)
    m = len(p.edges)
    ends = np.asarray(p.edges, np.int64).reshape(m, 2)
    eu, ev = ends[:, 0], ends[:, 1]
    sizes = k[eu] * k[ev]
    flat = (np.concatenate([np.asarray(c, np.float64).reshape(-1) for c in p.edge_costs])
            if m else np.zeros(0))
    if np.isnan(flat).any():
        raise InvalidProblemError(f"{p.name!r}: edge costs must not be NaN")
    eid = np.repeat(np.arange(m), sizes)
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    local = np.arange(flat.size) - start[eid]
    kv = k[ev][eid]
    ga, gb = off[eu][eid] + local // kv, off[ev][eid] + local % kv
    loop = eu[eid] == ev[eid]
    diag = loop & (ga == gb)
    np.add.at(cost, ga[diag], flat[diag])  # NOTE: a self-loop costs c[p, p] under strategy p
    # merge parallel and reversed edges block-wise: one dense block per node pair
    keep = ~loop
    ra, rb = local[keep] // kv[keep], local[keep] % kv[keep]
    flat, e_of = flat[keep], eid[keep]
    lo_n, hi_n = np.minimum(eu, ev), np.maximum(eu, ev)
    nl = np.flatnonzero(eu != ev)
    pairs, pinv = np.unique(lo_n[nl] * n + hi_n[nl], return_inverse=True)
    pair_of_edge = np.full(m, -1, np.int64)
    pair_of_edge[nl] = pinv
    plo, phi = pairs // max(n, 1), pairs % max(n, 1)
    khi = k[phi]
    mbase = np.zeros(pairs.size + 1, np.int64)
    np.cumsum(k[plo] * khi, out=mbase[1:])
    swap = (eu > ev)[e_of]
    pe = pair_of_edge[e_of]
    pos = mbase[pe] + np.where(swap, rb, ra) * khi[pe] + np.where(swap, ra, rb)
    total = int(mbase[-1])
    isinf = np.isinf(flat)
    c = np.bincount(pos, weights=np.where(isinf, 0.0, flat), minlength=total)
    c[np.bincount(pos, weights=isinf, minlength=total) > 0] = math.inf
    peid = np.repeat(np.arange(pairs.size), np.diff(mbase))
    i = np.arange(total) - mbase[peid]
    A, B = off[plo][peid] + i // khi[peid], off[phi][peid] + i % khi[peid]
    ebase = mbase[:-1]
    return Flat(n, k, off, node_of, cost, mem, iv, A, B, c, pairs // max(n, 1), pairs % max(n, 1),
                peid, ebase, p.memory_limit)


def _first_allowed(f: Flat, allowed: np.ndarray) -> np.ndarray:
    first = np.full(f.n, -1, np.int64)
    g = np.flatnonzero(allowed)[::-1]
    first[f.node_of[g]] = g  # reversed, so the smallest index is written last
    return first


def _arc_consistency(f: Flat, allowed: np.ndarray) -> int:
    m = f.pu.size
    rows_per, cols_per = f.k[f.pu], f.k[f.pv]
    rbase = np.concatenate([[0], np.cumsum(rows_per)]).astype(np.int64)
    cbase = np.concatenate([[0], np.cumsum(cols_per)]).astype(np.int64)
    rid = rbase[f.eid] + f.A - f.off[f.pu][f.eid]
    cid = cbase[f.eid] + f.B - f.off[f.pv][f.eid]
    redge, cedge = np.repeat(np.arange(m), rows_per), np.repeat(np.arange(m), cols_per)
    row_g = f.off[f.pu][redge] + np.arange(rbase[-1]) - rbase[redge]
    col_g = f.off[f.pv][cedge] + np.arange(cbase[-1]) - cbase[cedge]
    finite = np.isfinite(f.c)
    rounds = 0
    while True:
        rounds += 1
        valid = finite & allowed[f.A] & allowed[f.B]
        rsup = np.bincount(rid, weights=valid, minlength=rbase[-1]) > 0
        csup = np.bincount(cid, weights=valid, minlength=cbase[-1]) > 0
        kill = np.concatenate([row_g[~rsup], col_g[~csup]])
        kill = kill[allowed[kill]]
        if kill.size == 0:
            return rounds
        allowed[kill] = False


_M1, _M2, _M3 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray, salt: int) -> np.ndarray:
    """splitmix64 finalizer of ``x ^ salt`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = (x ^ np.uint64(salt)) + _M3
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _signature(f: Flat, allowed: np.ndarray, salt: int) -> np.ndarray:
    """A 64-bit hash per strategy of (cost, memory, every incident edge row or column),
    where entries against forbidden partners read as one sentinel value."""
    sig = _mix(f.cost.view(np.uint64), salt) ^ _mix(f.mem.view(np.uint64), salt + 1)
    eid = f.eid.astype(np.uint64)
    for own, other, base_other, ends in ((f.A, f.B, f.off[f.pv], 2), (f.B, f.A, f.off[f.pu], 3)):
        val = np.where(allowed[other], f.c, np.nan).view(np.uint64)
        pos = (other - base_other[f.eid]).astype(np.uint64)
        h = _mix(val ^ _mix(pos, salt + ends), salt + 7 * ends)
        row = _mix(eid, salt + 11 * ends)
        np.bitwise_xor.at(sig, own, _mix(h, 0) ^ row)  # NOTE: XOR of per-entry hashes
    return sig


def _dedup(f: Flat, allowed: np.ndarray) -> int:
    """Forbid strategies identical to a lower one of the same node; returns how many.

    Identical = same cost, memory and edge rows (on allowed partners), compared through
    two independent 64-bit hashes: a plan using the duplicate costs and weighs the same
    with the kept one, so the optimum is unchanged.
    """
    removed = 0
    while True:
        h1, h2 = _signature(f, allowed, 1), _signature(f, allowed, 1000)
        g = np.flatnonzero(allowed)
        order = np.lexsort((g, h2[g], h1[g], f.node_of[g]))
        gs = g[order]
        same = ((f.node_of[gs][1:] == f.node_of[gs][:-1]) & (h1[gs][1:] == h1[gs][:-1])
                & (h2[gs][1:] == h2[gs][:-1]))
        dup = gs[1:][same]
        if dup.size == 0:
            return removed
        allowed[dup] = False
        removed += int(dup.size)


def reduce(f: Flat, use_memory_limit: bool = True, dedup: bool = True) -> Reduced:
    """Presolve ``f`` (steps 1-4 of the module docstring)."""
    allowed = np.isfinite(f.cost)
    live = f.iv[:, 0] < f.iv[:, 1]
    if use_memory_limit and f.limit is not None:
        allowed &= ~((f.mem > f.limit) & live[f.node_of])
    rounds = _arc_consistency(f, allowed)
    dups = _dedup(f, allowed) if dedup else 0
    na = np.bincount(f.node_of, weights=allowed, minlength=f.n).astype(np.int64)
    empty = np.flatnonzero(na == 0)
    first = _first_allowed(f, allowed)
    fixed = np.where(na == 1, first - f.off[:-1], -1)
    cost = np.where(allowed, f.cost, math.inf)
    const = float(np.sum(cost[first[na == 1]]))
    valid = np.isfinite(f.c) & allowed[f.A] & allowed[f.B]
    fa, fb = (na == 1)[f.node_of[f.A]], (na == 1)[f.node_of[f.B]]
    const += float(np.sum(f.c[valid & fa & fb]))
    np.add.at(cost, f.B[valid & fa & ~fb], f.c[valid & fa & ~fb])
    np.add.at(cost, f.A[valid & fb & ~fa], f.c[valid & fb & ~fa])
    # Separable edges among free nodes: c[p,q] - c[p,q0] - c[p0,q] + c[p0,q0] == 0.
    free_edge = (na[f.pu] > 1) & (na[f.pv] > 1)
    grid = free_edge[f.eid] & allowed[f.A] & allowed[f.B]
    safe = np.where(first < 0, f.off[:-1], first)  # empty nodes: any index, never used
    a0, b0 = safe[f.pu][f.eid], safe[f.pv][f.eid]
    kv = f.k[f.pv][f.eid]
    base = f.ebase[f.eid]
    ra, rb = f.A - f.off[f.pu][f.eid], f.B - f.off[f.pv][f.eid]
    r0, q0 = a0 - f.off[f.pu][f.eid], b0 - f.off[f.pv][f.eid]
    i_pq0, i_p0q, i_00 = base + ra * kv + q0, base + r0 * kv + rb, base + r0 * kv + q0
    with np.errstate(invalid="ignore"):
        res = f.c - f.c[i_pq0] - f.c[i_p0q] + f.c[i_00]
        scale = np.abs(f.c) + np.abs(f.c[i_pq0]) + np.abs(f.c[i_p0q]) + np.abs(f.c[i_00])
        # NaN (inf - inf) and inf (an inf entry: inf <= inf * 1e-12 holds) count as bad
        bad = grid & ~(np.isfinite(res) & (np.abs(res) <= 1e-12 * scale))
    nonsep = np.bincount(f.eid, weights=bad, minlength=f.pu.size) > 0
    sep = free_edge & ~nonsep
    on_a = grid & sep[f.eid] & (f.B == b0)
    on_b = grid & sep[f.eid] & (f.A == a0)
    np.add.at(cost, f.A[on_a], f.c[on_a])
    np.add.at(cost, f.B[on_b], f.c[on_b] - f.c[i_00[on_b]])
    keep_edge = free_edge & nonsep
    keep = keep_edge[f.eid] & valid
    new_id = np.cumsum(keep_edge) - 1
    stats = dict(nodes=f.n, strategies=int(f.off[-1]), edges=int(f.pu.size),
                 free_nodes=int((na > 1).sum()), allowed=int(allowed[(na > 1)[f.node_of]].sum()),
                 fixed_nodes=int((na == 1).sum()), separable_edges=int((free_edge & ~nonsep).sum()),
                 kept_edges=int(keep_edge.sum()), edge_vars=int(keep.sum()), ac_rounds=rounds, duplicates=dups)
    return Reduced(f, allowed, fixed, cost, const, f.A[keep], f.B[keep], f.c[keep],
                   new_id[f.eid[keep]], int(keep_edge.sum()), empty, stats)
