"""Tensors with no tensor inputs: parameters, inputs, optimizer state, constants (arange, ones...).

Any non-Partial placement whose splits divide the shape; producing a shard is free.
``new_zeros(x, size)`` and its kin read only ``x``'s dtype and device: ``x`` is unread,
so its layout costs nothing.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("placeholder", "aten.arange", "aten.ones", "aten.zeros", "aten.full", "aten.empty",
          "aten.scalar_tensor", "aten.randn", "aten.rand", "aten.empty_strided")
def source(node: Node, graph: Graph) -> DimRule:
    return DimRule(tuple(), tuple(dims("d", o.ndim) for o in node.outputs), flops=0.0)


@register("aten.new_zeros", "aten.new_empty", "aten.new_full", "aten.new_ones", "aten.new_empty_strided")
def new_factory(node: Node, graph: Graph) -> DimRule:
    template = tuple(tuple(None for _ in node.input_meta(graph, i).shape) for i in range(len(node.inputs)))
    return DimRule(template, tuple(dims("d", o.ndim) for o in node.outputs), unread=frozenset(range(len(template))))
