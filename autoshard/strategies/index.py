"""gather / scatter / index_select / index_add / index: the indexed dim is never split.

Other dims are shared by the source, the index and the output (``gather`` and
``scatter`` index tensors have the output's rank); ``index_select``'s index is a
vector kept whole.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


def _without(ndim: int, dim: int) -> tuple:
    return tuple(None if d == dim else l for d, l in enumerate(dims("d", ndim)))


@register("aten.gather")
def gather(node: Node, graph: Graph) -> DimRule:
    x, idx = ins(node, graph)[:2]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    idx_labels = tuple(l if idx.shape[d] == x.shape[d] else None for d, l in enumerate(labels))
    return DimRule((labels, idx_labels), (idx_labels,), follower=True, leader=1, flops=float(idx.numel))


@register("aten.scatter", "aten.scatter_add", "aten.scatter_reduce")
def scatter(node: Node, graph: Graph) -> DimRule:
    metas = ins(node, graph)
    x = metas[0]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    rest = tuple(tuple(l if m.ndim == x.ndim and m.shape[d] == x.shape[d] else None
                       for d, l in enumerate(labels)) if m.ndim == x.ndim else tuple(None for _ in m.shape)
                 for m in metas[1:])
    return DimRule((labels,) + rest, (labels,), follower=True, flops=float(x.numel))


@register("aten.index_select")
def index_select(node: Node, graph: Graph) -> DimRule:
    x, idx = ins(node, graph)[:2]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    return DimRule((labels, (None,) * idx.ndim), (labels,), follower=True, flops=float(node.outputs[0].numel))


@register("aten.index_add")
def index_add(node: Node, graph: Graph) -> DimRule:
    x, idx, src = ins(node, graph)[:3]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    return DimRule((labels, (None,) * idx.ndim, labels), (labels,), follower=True, flops=float(src.numel))


@register("aten.index.Tensor")
def index(node: Node, graph: Graph) -> DimRule:
    """``x[idx0, ...]`` with leading tensor indices: the trailing, unindexed dims may split."""
    metas = ins(node, graph)
    x, n_idx = metas[0], len(metas) - 1
    out = node.outputs[0]
    tail = dims("t", x.ndim - n_idx)
    x_labels = (None,) * n_idx + tail
    idx_labels = tuple((None,) * m.ndim for m in metas[1:])
    out_labels = (None,) * (out.ndim - len(tail)) + tail
    return DimRule((x_labels,) + idx_labels, (out_labels,), follower=True, flops=float(out.numel))
