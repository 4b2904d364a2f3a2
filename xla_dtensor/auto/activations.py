"""A plan's activation layouts as sharding constraints on the lazy IR, re-applied every step.

The plan costs a layout for every decision op's output (matmuls, embeddings,
attention, reductions...). Left alone, XLA's propagation picks its own layouts for
them, which the plan did not cost. :class:`ActivationTable` remembers, per recorded
op, which layout the plan chose and sets ``node.sharding`` (the executor applies it
with ``with_sharding_constraint``) on the matching IR node of every later step.

IR nodes are recorded anew each step, so a node is found again by its *signature
key* (the op and its input metadata, ``Node.key``) and its occurrence among the
nodes with that key in the pending graph's topological order, which is the same for
identical steps. :meth:`ActivationTable.apply` costs one pass over the pending nodes
and a dict look-up per node (the planning step and ``compile``'s traces use it). A
plain ``sync()`` instead queues the table (``state.defer``) and
:meth:`ActivationTable.constrain` reads the sync's own walk of the graph: the
positions to constrain are found once per graph structure (``plan.struct``) and
cached, so a repeated step pays one hash of the structure, not a second walk (that
walk and its look-ups cost 1.1-1.6 ms of a 4-layer GPT-2 step's ~20 ms).

Example:
    >>> table = ActivationTable({})  # doctest: +SKIP
    >>> table.apply([s.value for s in pending])  # doctest: +SKIP
"""
from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Any

from xla_dtensor.core.ir import topo_order

__all__ = ["ActivationTable", "occurrence_keys"]


def occurrence_keys(order: list[Any]) -> dict[int, tuple[Any, int]]:
    """``id(node) -> (node.key, k)`` for the op nodes of ``order``: the k-th node with that key."""
    seen: dict[Any, int] = {}
    out: dict[int, tuple[Any, int]] = {}
    for n in order:
        if n.fn is None:
            continue
        k = seen.get(n.key, 0)
        seen[n.key] = k + 1
        out[id(n)] = (n.key, k)
    return out


class ActivationTable:
    """``(node.key, occurrence) -> NamedSharding`` for the constrained activations of a step."""

    __slots__ = ("entries", "applied", "token", "_positions")
    _TOKENS = itertools.count()
    CACHED = 8  # graph structures whose positions are kept

    def __init__(self, entries: Mapping[tuple[Any, int], Any]) -> None:
        self.entries = dict(entries)
        self.applied = 0  # constraints set by the last apply() / constrain()
        self.token = next(self._TOKENS)  # names this table in program cache keys
        self._positions: dict[tuple, tuple[list[tuple[int, Any]], tuple]] = {}  # struct -> (pairs, its struct)

    @classmethod
    def from_nodes(cls, order: list[Any], shardings: Mapping[int, Any]) -> ActivationTable:
        """The table for ``order`` (a topological order of the pending IR) and ``id(node) -> sharding``."""
        keys = occurrence_keys(order)
        return cls({keys[i]: sh for i, sh in shardings.items() if i in keys})

    def apply(self, roots: list[Any]) -> int:
        """Set ``node.sharding`` on the IR nodes of ``roots``' graph the table names; returns how many."""
        if not self.entries:
            self.applied = 0
            return 0
        order = topo_order(roots)
        pairs = self._find(order, set(), len(order))
        for pos, sh in pairs:
            order[pos].sharding = sh
        hit = len(pairs)
        self.applied = hit
        return hit

    def constrain(self, plan: Any, skip: Callable[[], set[int]], limit: int) -> Any:
        """``plan`` (an ``executor.Plan``) with the table's constraints set on its nodes and shardings,
        its ``struct`` extended by this table's token. The nodes counted are the op nodes of
        ``plan.order[:limit]`` not in ``skip()`` (ids of nodes the sync hooks added, asked for only
        when the structure is new): the graph :meth:`apply` would have walked."""
        hit = self._positions.get(plan.struct)
        if hit is None:
            if len(self._positions) >= self.CACHED:
                self._positions.clear()
            # NOTE: the extended structure is one object per structure: the sync's caches by the
            # structure's identity (its packs, its device) then hit on a repeated step
            hit = self._positions[plan.struct] = (self._find(plan.order, skip(), limit), (plan.struct, self.token))
        pairs, struct = hit
        if plan.filled:
            order, shardings = plan.order, plan.shardings
            for pos, sh in pairs:
                order[pos].sharding = sh
                shardings[pos] = sh
        else:  # a repeated step's plan: its lists, if ever filled, read the nodes' shardings
            for pos, sh in pairs:
                plan.node_at(pos).sharding = sh
        self.applied = len(pairs)
        return plan._replace(struct=struct)

    def _find(self, order: list[Any], skip: set[int], limit: int) -> list[tuple[int, Any]]:
        entries, seen, out = self.entries, {}, []
        for pos in range(limit):
            n = order[pos]
            if n.fn is None or id(n) in skip:
                continue
            key = n.key
            k = seen.get(key, 0)
            seen[key] = k + 1
            sh = entries.get((key, k))
            if sh is not None:
                out.append((pos, sh))
        return out
