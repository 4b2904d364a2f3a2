"""``tril`` / ``triu``: the last two dims (the matrix) are never split, batch dims follow.

A shard of the matrix dims would apply the diagonal offset to local indices. Masking
is linear, so a ``Partial`` input flows through.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.tril", "aten.triu")
def triangular(node: Node, graph: Graph) -> DimRule:
    out = node.outputs[0]
    labels = dims("d", out.ndim)[:-2] + (None,) * min(2, out.ndim)
    return DimRule((labels,), (labels,), linear=True, follower=True, flops=float(out.numel))
