"""Embedding lookup and its backward.

Forward ``(weight [V, H], ids [...]) -> [..., H]``: split ids -> split rows; split V
-> masked lookup with Partial output; split H -> split last dim. Backward
``(grad [..., H], ids, V) -> [V, H]``: split ids leave a Partial gradient; it is
linear in ``grad``, so a Partial ``grad`` (a position embedding's, summed over a split
batch) passes through as a Partial weight gradient, reduced once with the others.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.embedding")
def embedding(node: Node, graph: Graph) -> DimRule:
    weight, ids = ins(node, graph)[:2]
    b = dims("b", ids.ndim)
    return DimRule((("v", "h"), b), (b + ("h",),), frozenset({"v"}), flops=float(node.outputs[0].numel))


@register("aten.embedding_dense_backward")
def embedding_backward(node: Node, graph: Graph) -> DimRule:
    grad, ids = ins(node, graph)[:2]
    b = dims("b", ids.ndim)
    return DimRule((b + ("h",), b), (("v", "h"),), frozenset(b), flops=float(grad.numel),
                   passthrough=frozenset({0}))
