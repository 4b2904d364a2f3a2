"""A plan's activation layouts as sharding constraints on the lazy IR, re-applied every step.

The plan costs a layout for every decision op's output (matmuls, embeddings,
attention, reductions...). Left alone, XLA's propagation picks its own layouts for
them, which the plan did not cost. :class:`ActivationTable` remembers, per recorded
op, which layout the plan chose and sets ``node.sharding`` (the executor applies it
with ``with_sharding_constraint``) on the matching IR node of every later step.

IR nodes are recorded anew each step, so a node is found again by its *signature
key* (the op and its input metadata, ``Node.key``) and its occurrence among the
nodes with that key in the pending graph's topological order, which is the same for
identical steps. Applying costs one pass over the pending nodes and a dict look-up
per node; constraints are the same objects every step, so the executor's program
cache (keyed by node shardings) hits.

Example:
    >>> table = ActivationTable({})  # doctest: +SKIP
    >>> table.apply([s.value for s in pending])  # doctest: +SKIP
"""
from __future__ import annotations

from collections.abc import Mapping
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

    __slots__ = ("entries", "applied")

    def __init__(self, entries: Mapping[tuple[Any, int], Any]) -> None:
        self.entries = dict(entries)
        self.applied = 0  # constraints set by the last apply()

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
        entries, seen, hit = self.entries, {}, 0
        for n in topo_order(roots):
            if n.fn is None:
                continue
            key = n.key
            k = seen.get(key, 0)
            seen[key] = k + 1
            sh = entries.get((key, k))
            if sh is not None:
                n.sharding = sh
                hit += 1
        self.applied = hit
        return hit
