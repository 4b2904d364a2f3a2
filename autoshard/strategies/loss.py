"""Regression losses: ``mse_loss`` reduces every dim (split dims leave Partial sums), its backward is elementwise."""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


def _reduction(node: Node, pos: int) -> int:
    return node.args[pos] if len(node.args) > pos and isinstance(node.args[pos], int) else 1  # 1: mean


@register("aten.mse_loss")
def mse_loss(node: Node, graph: Graph) -> DimRule:
    """(input, target, reduction) -> loss: reduced (mean/sum) -> Partial over split dims; none -> elementwise."""
    x = ins(node, graph)[0]
    labels = dims("d", x.ndim)
    if _reduction(node, 2) == 0:
        return DimRule((labels, labels), (labels,), follower=True, flops=3.0 * x.numel)
    return DimRule((labels, labels), ((),), frozenset(labels), follower=True, flops=3.0 * x.numel)


@register("aten.mse_loss_backward")
def mse_loss_backward(node: Node, graph: Graph) -> DimRule:
    """(grad, input, target, reduction) -> grad_input: follows the input; a reduced grad is replicated."""
    g, x = ins(node, graph)[:2]
    labels = dims("d", x.ndim)
    g_labels = labels if _reduction(node, 3) == 0 else tuple(None for _ in g.shape)
    return DimRule((g_labels, labels, labels), (labels,), follower=True, leader=1, flops=4.0 * x.numel)
