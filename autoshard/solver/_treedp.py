"""Exact block moves for the search: min-sum dynamic programming on induced forests.

Single-node moves stall where a whole chain of nodes must switch strategy together (a
resharding edge penalizes every partial switch). This module picks a block ``T`` of free
nodes whose induced subgraph is a forest (a BFS spanning forest of the kept-edge graph
with one endpoint of every non-tree edge left out), keeps every other node at its current
strategy, and finds the exact best strategies of ``T`` by leaf-to-root min-sum messages
(vectorized per BFS level), then root-to-leaf backtracking. Memory is not a constraint
of the DP: it enters as per-row prices (Lagrangian), and the caller checks the result.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, connected_components

__all__ = ["Forest", "random_forest", "forest_dp"]


class Forest:
    """A block of nodes inducing a forest; levels of (child, parent, edge) by BFS depth."""

    def __init__(self, in_t: np.ndarray, levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
                 roots: np.ndarray) -> None:
        self.in_t, self.levels, self.roots = in_t, levels, roots


def random_forest(space, rng: np.random.Generator, full: bool = False) -> Forest:
    """BFS forest from random roots, one endpoint of each non-tree edge removed.

    ``full``: keep every free node (non-tree edges are then left to the caller).
    """
    n, m = space.n, space.eu.size
    perm = rng.permutation(n)  # relabel so BFS tie-breaking varies
    inv = np.argsort(perm)
    a, b = inv[space.eu], inv[space.ev]
    g = sp.coo_matrix((np.ones(2 * m), (np.concatenate([a, b]), np.concatenate([b, a]))),
                      shape=(n, n)).tocsr()
    ncomp, lab = connected_components(g, directed=False)
    reps = np.full(ncomp, -1, np.int64)
    reps[lab[::-1]] = np.arange(n)[::-1]
    # super-root n joined to one node per component
    rows = np.concatenate([np.concatenate([a, b]), np.full(ncomp, n), reps])
    cols = np.concatenate([np.concatenate([b, a]), reps, np.full(ncomp, n)])
    g2 = sp.coo_matrix((np.ones(rows.size), (rows, cols)), shape=(n + 1, n + 1)).tocsr()
    order, pred = breadth_first_order(g2, n, directed=False, return_predecessors=True)
    for_depth = order[1:]
    pr = pred[for_depth]
    depth_arr = np.zeros(n + 1, np.int64)
    for v, p in zip(for_depth.tolist(), pr.tolist()):  # BFS order: parents come first
        depth_arr[v] = depth_arr[p] + 1
    predo = np.where(pr == n, -1, pr)  # relabeled parent, -1 for component roots
    parent = np.full(n, -1, np.int64)
    parent[perm[for_depth]] = np.where(predo >= 0, perm[np.maximum(predo, 0)], -1)
    dep = np.empty(n, np.int64)
    dep[perm[for_depth]] = depth_arr[for_depth]
    tree = (parent[space.eu] == space.ev) | (parent[space.ev] == space.eu)
    nt = np.flatnonzero(~tree)
    prio = rng.random(n)  # each non-tree edge drops its lower-priority endpoint
    out = np.where(prio[space.eu[nt]] < prio[space.ev[nt]], space.eu[nt], space.ev[nt])
    in_t = space.free_mask.copy()
    if not full:
        in_t[out] = False
    te = np.flatnonzero(tree & in_t[space.eu] & in_t[space.ev])
    child = np.where(parent[space.eu[te]] == space.ev[te], space.eu[te], space.ev[te])
    par = np.where(child == space.eu[te], space.ev[te], space.eu[te])
    has_parent = np.zeros(n, bool)
    has_parent[child] = True
    roots = np.flatnonzero(in_t & ~has_parent)
    cd = dep[child]
    levels = []
    for lv in np.unique(cd)[::-1].tolist():
        s = cd == lv
        levels.append((child[s], par[s], te[s]))
    forest = Forest(in_t, levels, roots)
    forest.non_tree = nt
    return forest


def forest_dp(space, ch: np.ndarray, forest: Forest, extra: np.ndarray | None = None) -> np.ndarray:
    """Best strategies of the forest's nodes given the others in ``ch`` (global ids).

    ``extra`` adds a per-strategy cost (memory prices, estimates of left-out edges).
    Returns the new ``ch``.
    """
    off, node_of = space.off, space.node_of
    in_t = forest.in_t
    loc = ch - off[:-1]
    vals = space.W[space.static + loc[space.other] * space.mult]
    outside = ~in_t[space.other]
    belief = space.cost + np.bincount(space.tgt[outside], weights=vals[outside], minlength=space.cost.size)
    if extra is not None:
        belief = belief + extra
    back = []
    for child, par, e in forest.levels:
        ku, kv = space.k[space.eu[e]], space.k[space.ev[e]]
        size = ku * kv
        rep = np.repeat(np.arange(e.size), size)
        i = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
        w = space.W[space.ebase[e][rep] + i]
        ga = off[space.eu[e]][rep] + i // kv[rep]
        gb = off[space.ev[e]][rep] + i % kv[rep]
        child_is_b = (child == space.ev[e])[rep]
        cg = np.where(child_is_b, gb, ga)
        pg = np.where(child_is_b, ga, gb)
        kp = space.k[par]
        goff = np.cumsum(kp) - kp
        grp = goff[rep] + pg - off[par][rep]
        val = w + belief[cg]
        msg = np.full(int(kp.sum()), np.inf)
        np.minimum.at(msg, grp, val)
        hit = np.flatnonzero(val == msg[grp])[::-1]
        best = np.full(msg.size, -1, np.int64)
        best[grp[hit]] = cg[hit]  # reversed: the lowest child strategy wins
        pg_of_grp = np.repeat(off[par], kp) + (np.arange(msg.size) - np.repeat(goff, kp))
        np.add.at(belief, pg_of_grp, msg)
        back.append((child, par, goff, best))
    new = ch.copy()
    r = forest.roots
    if r.size:
        bv = np.minimum.reduceat(belief, off[:-1])
        g = np.flatnonzero((belief == bv[node_of]) & in_t[node_of])[::-1]
        first = np.full(space.n, -1, np.int64)
        first[node_of[g]] = g
        ok = first[r] >= 0
        new[r[ok]] = first[r[ok]]
    for child, par, goff, best in reversed(back):
        pick = best[goff + new[par] - off[par]]
        ok = pick >= 0
        new[child[ok]] = pick[ok]
    return new
