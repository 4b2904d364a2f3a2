"""Softmax / log-softmax and layer norm: follow the input; normalized dims are never split."""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


def _softmax_labels(node: Node, graph: Graph) -> tuple[str | None, ...]:
    x = node.outputs[0]
    dim = norm_dim(next(a for a in node.args if isinstance(a, int) and not isinstance(a, bool)), x.ndim)
    return tuple(None if d == dim else l for d, l in enumerate(dims("d", x.ndim)))


@register("aten._softmax", "aten._log_softmax", "aten._safe_softmax", "aten.softmax.int", "aten.log_softmax.int")
def softmax(node: Node, graph: Graph) -> DimRule:
    labels = _softmax_labels(node, graph)
    return DimRule((labels,), (labels,), follower=True, flops=5.0 * node.outputs[0].numel)


@register("aten._softmax_backward_data", "aten._log_softmax_backward_data")
def softmax_backward(node: Node, graph: Graph) -> DimRule:
    labels = _softmax_labels(node, graph)
    return DimRule((labels, labels), (labels,), follower=True, flops=4.0 * node.outputs[0].numel)


def _ln_labels(x_ndim: int, n_norm: int) -> tuple[tuple, tuple, tuple]:
    batch = dims("d", x_ndim - n_norm)
    x = batch + (None,) * n_norm
    stat = batch + (None,) * n_norm  # mean / rstd keep the normalized dims as size 1
    return x, stat, (None,) * n_norm


@register("aten.native_layer_norm")
def layer_norm(node: Node, graph: Graph) -> DimRule:
    """(x, normalized_shape, weight?, bias?, eps) -> (out, mean, rstd)."""
    metas = ins(node, graph)
    n_norm = len(node.args[1])
    x, stat, w = _ln_labels(metas[0].ndim, n_norm)
    return DimRule((x,) + (w,) * (len(metas) - 1), (x, stat, stat), follower=True,
                   flops=8.0 * metas[0].numel)


@register("aten.native_layer_norm_backward")
def layer_norm_backward(node: Node, graph: Graph) -> DimRule:
    """(dy, x, shape, mean, rstd, w?, b?, mask) -> (dx, dw, db): split batch dims leave dw, db Partial."""
    metas = ins(node, graph)
    n_norm = len(node.args[2])
    x, stat, w = _ln_labels(metas[0].ndim, n_norm)
    batch = frozenset(l for l in x if l)
    in_labels = (x, x, stat, stat) + (w,) * (len(metas) - 4)
    outs = tuple(x if i == 0 else w for i in range(len(node.outputs)))
    return DimRule(in_labels, outs, batch, follower=True, flops=12.0 * metas[0].numel)
