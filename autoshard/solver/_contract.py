"""Contract bijection edges: nodes whose strategies determine each other become one node.

An edge whose finite entries pair every strategy of ``u`` with exactly one of ``v`` and
vice versa (a permutation matrix of finite entries, ``inf`` elsewhere) forces ``v``'s
strategy once ``u``'s is chosen. XLA's auto-sharding instances are full of them (a
follower op and its operand): on IOPDDL M/P about two thirds of the edges that survive
presolve. Each connected component of such edges becomes one compact node whose
strategy ``j`` is its root's ``j``-th strategy; members follow along a BFS tree.
Exact: node costs and edge entries along the tree are summed per ``j``; edges inside a
component that disagree (a cycle whose permutations do not compose to the identity, or
an ``inf`` entry) forbid ``j``; edges between components are re-indexed and merged;
memory terms are re-indexed (a member keeps its own interval).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, connected_components

from autoshard.solver._compact import Compact, _offsets, entry_index, simplify

__all__ = ["contract", "bijection_edges"]


def bijection_edges(compact: Compact) -> np.ndarray:
    """Edges whose finite entries form a permutation matrix."""
    if compact.m == 0:
        return np.zeros(0, bool)
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    fin = np.isfinite(compact.W)
    ku, kv = compact.k[compact.eu], compact.k[compact.ev]
    rb, cb = _offsets(ku), _offsets(kv)
    rows = np.bincount(rb[e][fin] + (r - compact.off[compact.eu][e])[fin], minlength=int(rb[-1]))
    cols = np.bincount(cb[e][fin] + (c - compact.off[compact.ev][e])[fin], minlength=int(cb[-1]))
    rbad = np.bincount(np.repeat(np.arange(compact.m), ku), weights=rows != 1, minlength=compact.m)
    cbad = np.bincount(np.repeat(np.arange(compact.m), kv), weights=cols != 1, minlength=compact.m)
    return (ku == kv) & (rbad == 0) & (cbad == 0)


def _partner(compact: Compact, bij: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sorted keys ``edge * G + g`` -> partner strategy (both directions) of bijection edges."""
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    on = bij[e] & np.isfinite(compact.W)
    G = int(compact.off[-1])
    keys = np.concatenate([e[on] * G + r[on], e[on] * G + c[on]])
    vals = np.concatenate([c[on], r[on]])
    order = np.argsort(keys, kind="stable")
    return keys[order], vals[order], np.int64(G)


def _maps(compact: Compact, bij: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Component label per node and, per node, the global strategy for each component strategy."""
    n = compact.n
    be = np.flatnonzero(bij)
    a, b = compact.eu[be], compact.ev[be]
    g = sp.coo_matrix((np.ones(2 * be.size), (np.concatenate([a, b]), np.concatenate([b, a]))),
                      shape=(n, n)).tocsr()
    ncomp, lab = connected_components(g, directed=False)
    root = np.full(ncomp, n, np.int64)
    np.minimum.at(root, lab, np.arange(n))
    rows = np.concatenate([a, b, np.full(ncomp, n), root])
    cols = np.concatenate([b, a, root, np.full(ncomp, n)])
    g2 = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n + 1, n + 1)).tocsr()
    order, pred = breadth_first_order(g2, n, directed=False, return_predecessors=True)
    order = order[1:]
    depth = np.zeros(n + 1, np.int64)
    for v, p in zip(order.tolist(), pred[order].tolist()):  # BFS order: parents first
        depth[v] = depth[p] + 1
    # tree edge of each non-root node: the bijection edge joining it to its BFS parent
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    ekey = lo * n + hi
    eorder = np.argsort(ekey)
    par = pred[:n]
    nonroot = np.flatnonzero(par != n)
    pk = np.minimum(nonroot, par[nonroot]) * n + np.maximum(nonroot, par[nonroot])
    tree_e = be[eorder[np.searchsorted(ekey[eorder], pk)]]
    kc = compact.k[root][lab]  # every member has the root's strategy count
    moff = _offsets(kc)
    M = np.zeros(int(moff[-1]), np.int64)
    rk = compact.k[root]
    rr = np.repeat(root, rk)
    jr = np.arange(rr.size) - np.repeat(_offsets(rk)[:-1], rk)
    M[moff[rr] + jr] = compact.off[rr] + jr
    keys, vals, G = _partner(compact, bij)
    d_non = depth[nonroot]
    for d in range(1, int(d_non.max()) + 1 if d_non.size else 1):
        ch = nonroot[d_non == d]
        pa, te = par[ch], tree_e[d_non == d]
        size = kc[ch]
        idx = np.arange(int(size.sum())) - np.repeat(_offsets(size)[:-1], size)
        src = M[np.repeat(moff[pa], size) + idx]
        pos = np.searchsorted(keys, np.repeat(te, size) * G + src)
        M[np.repeat(moff[ch], size) + idx] = vals[pos]
    return lab, moff, M


def contract(compact: Compact) -> Compact:
    """Contract every bijection component (repeated while simplification exposes new ones)."""
    compact = simplify(compact)
    while True:
        bij = bijection_edges(compact)
        if not bij.any():
            return compact
        compact = simplify(_contract_once(compact, bij))


def _contract_once(compact: Compact, bij: np.ndarray) -> Compact:
    lab, moff, M = _maps(compact, bij)
    nc = int(lab.max()) + 1
    root = np.full(nc, compact.n, np.int64)
    np.minimum.at(root, lab, np.arange(compact.n))
    k2 = compact.k[root]
    off2 = _offsets(k2)
    # inverse of each member's map: global strategy -> component strategy
    node_rep = np.repeat(np.arange(compact.n), np.diff(moff))
    jj = np.arange(M.size) - moff[node_rep]
    inv = np.full(int(compact.off[-1]), -1, np.int64)
    inv[M] = jj
    cost = np.zeros(int(off2[-1]))
    np.add.at(cost, off2[lab[node_rep]] + jj, compact.cost[M])
    e, r, c = entry_index(compact.k, compact.off, compact.eu, compact.ev, compact.ebase)
    cu, cv = lab[compact.eu], lab[compact.ev]
    inside = cu == cv
    # edges inside a component: entry (M_u[j], M_v[j]) per component strategy j
    ie = np.flatnonzero(inside)
    size = k2[cu[ie]]
    rep = np.repeat(ie, size)
    j = np.arange(int(size.sum())) - np.repeat(_offsets(size)[:-1], size)
    mu = M[moff[compact.eu[rep]] + j] - compact.off[compact.eu[rep]]
    mv = M[moff[compact.ev[rep]] + j] - compact.off[compact.ev[rep]]
    np.add.at(cost, off2[cu[rep]] + j, compact.W[compact.ebase[rep] + mu * compact.k[compact.ev[rep]] + mv])
    # edges between components: permute each block to component strategies, orient, merge
    sel = ~inside[e]
    ex, rx, cxx = e[sel], r[sel], c[sel]
    ju, jv = inv[rx], inv[cxx]
    a, b = cu[ex], cv[ex]
    swap = a > b
    lo, hi = np.where(swap, b, a), np.where(swap, a, b)
    jl, jh = np.where(swap, jv, ju), np.where(swap, ju, jv)
    pair = lo * nc + hi
    upair, pid = np.unique(pair, return_inverse=True)
    eu2, ev2 = upair // nc, upair % nc
    ebase2 = _offsets(k2[eu2] * k2[ev2])
    W2 = np.zeros(int(ebase2[-1]))
    np.add.at(W2, ebase2[pid] + jl * k2[ev2][pid] + jh, compact.W[sel])
    # memory terms and the original nodes' maps
    tg2 = off2[lab[compact.node_of[compact.tg]]] + inv[compact.tg] if compact.tg.size else compact.tg
    comp2 = np.where(compact.comp >= 0, lab[np.maximum(compact.comp, 0)], -1)
    vk2 = np.where(comp2 >= 0, k2[np.maximum(comp2, 0)], 0)
    vmap_off2 = _offsets(vk2)
    v_of = np.repeat(np.arange(compact.comp.size), vk2)
    j2 = np.arange(int(vmap_off2[-1])) - vmap_off2[v_of]
    u_old = compact.comp[v_of]
    vmap2 = compact.vmap[compact.vmap_off[v_of] + M[moff[u_old] + j2] - compact.off[u_old]]
    return Compact(nc, k2, off2, cost, compact.const, eu2, ev2, ebase2, W2, compact.limit, compact.base,
                   tg2, compact.tcoef, compact.tlo, compact.thi, compact.tv, comp2, compact.fixed0,
                   vmap_off2, vmap2)
