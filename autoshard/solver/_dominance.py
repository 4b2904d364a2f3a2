"""Remove dominated strategies of a :class:`~autoshard.solver._compact.Compact` problem.

Strategy ``q`` of node ``u`` dominates ``p`` when switching any plan from ``p`` to ``q``
can only lower the cost and never raises memory:

    cost[q] - cost[p] + sum over edges (u, w) of max_r (W[q, r] - W[p, r]) <= 0

(entries where ``p`` is forbidden are skipped; ``q`` forbidden where ``p`` is not counts
as ``+inf``), and every member's memory under ``q`` is at most its memory under ``p``.
The bound is subadditive, so dominance is transitive and all dominated strategies can be
dropped at once; of mutually dominating (equivalent) strategies the lowest index stays.
Identical strategies are the special case where both directions hold.
"""
from __future__ import annotations

import math

import numpy as np

from autoshard.solver._compact import Compact, from_reduced, memory_ok, restrict
from autoshard.solver._contract import contract
from autoshard.solver._memory import MemoryRows
from autoshard.solver._presolve import Reduced

__all__ = ["dominated", "remove_dominated", "compact_presolve"]


def _edge_gain(block: np.ndarray) -> np.ndarray:
    """``out[p, q] = max_r (block[q, r] - block[p, r])`` with the inf conventions above."""
    bp = block[:, None, :]
    with np.errstate(invalid="ignore"):  # inf - inf where p is forbidden: masked below
        d = np.where(np.isinf(bp), -math.inf, block[None, :, :] - bp)
    return d.max(axis=2) if block.shape[1] else np.zeros((block.shape[0],) * 2)


def dominated(compact: Compact) -> np.ndarray:
    """Mask over global strategies: True where another strategy of the node dominates it."""
    D = []
    for u in range(compact.n):
        c = compact.cost[compact.off[u]:compact.off[u + 1]]
        D.append(c[None, :] - c[:, None])  # D[p, q] = cost[q] - cost[p]
    for e in range(compact.m):
        u, v = int(compact.eu[e]), int(compact.ev[e])
        block = compact.W[compact.ebase[e]:compact.ebase[e + 1]].reshape(compact.k[u], compact.k[v])
        D[u] += _edge_gain(block)
        D[v] += _edge_gain(block.T)
    mem = memory_ok(compact)
    out = np.zeros(int(compact.off[-1]), bool)
    for u in range(compact.n):
        dom = D[u] <= 0
        if mem[u] is not None:
            dom &= mem[u]
        np.fill_diagonal(dom, False)
        idx = np.arange(compact.k[u])
        tie_keeps_p = dom & dom.T & (idx[:, None] < idx[None, :])
        out[compact.off[u]:compact.off[u + 1]] = (dom & ~tie_keeps_p).any(axis=1)
    return out


def remove_dominated(compact: Compact) -> tuple[Compact, int]:
    """``compact`` without its dominated strategies, and how many were removed."""
    dom = dominated(compact)
    return restrict(compact, ~dom), int(dom.sum())


def compact_presolve(reduced: Reduced, memory: MemoryRows | None,
                     limit: float | None) -> tuple[Compact, dict]:
    """Contract bijections and drop dominated strategies until nothing changes.

    Raises :class:`autoshard.solver._compact.Infeasible` if some node loses every strategy.
    """
    compact = contract(from_reduced(reduced, memory, limit))
    removed = 0
    while compact.n:
        smaller, count = remove_dominated(compact)
        if count == 0:
            break
        removed += count
        compact = contract(smaller)
    stats = dict(compact_nodes=compact.n, compact_strategies=int(compact.off[-1]), compact_edges=compact.m,
                 compact_entries=int(np.isfinite(compact.W).sum()), dominated=removed,
                 memory_rows=compact.R if compact.limit is not None else 0)
    return compact, stats
