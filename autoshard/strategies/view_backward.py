"""Backward of views: ``slice_backward`` / ``select_backward`` place a gradient into zeros.

The output is the view's input shape; every dim the view kept follows the gradient,
the sliced (or re-inserted) dim is never split. Both are linear, so a ``Partial``
gradient flows through.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.slice_backward")
def slice_backward(node: Node, graph: Graph) -> DimRule:
    """(grad, input_sizes, dim, start, end, step) -> zeros(input_sizes) with grad in the slice."""
    out = node.outputs[0]
    dim = norm_dim(node.args[2], out.ndim)
    (g,) = ins(node, graph)[:1]
    labels = tuple(None if d == dim and g.shape[d] != out.shape[d] else l for d, l in enumerate(dims("d", out.ndim)))
    return DimRule((labels,), (labels,), linear=True, follower=True, flops=0.0)


@register("aten.select_backward")
def select_backward(node: Node, graph: Graph) -> DimRule:
    """(grad, input_sizes, dim, index) -> zeros(input_sizes) with grad at ``index`` of ``dim``."""
    out = node.outputs[0]
    dim = norm_dim(node.args[2], out.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", out.ndim)))
    return DimRule((labels[:dim] + labels[dim + 1:],), (labels,), linear=True, follower=True, flops=0.0)
