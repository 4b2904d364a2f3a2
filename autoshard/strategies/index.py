"""gather / scatter / index_select / index_add / index / index_put: the indexed dim of the target is never split.

Other dims are shared by the source, the index and the output (``gather`` and
``scatter`` index tensors have the output's rank); ``index_select``'s index is a
vector kept whole. The adding forms (``scatter_add``, ``index_add``: an MoE layer's
combine step) may also split the *positions* they add from (the index and the source
along the indexed dim): each device adds its share and the result is ``Partial``, the
target taken as ``Partial`` too (held by one device), so the sum is reduced once.
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
    adds = node.op.startswith("aten.scatter_add") and len(metas) == 3 and metas[1].shape == metas[2].shape
    rest = tuple(tuple("i" if adds and d == dim else l if m.ndim == x.ndim and m.shape[d] == x.shape[d] else None
                       for d, l in enumerate(labels)) if m.ndim == x.ndim else tuple(None for _ in m.shape)
                 for m in metas[1:])
    if adds:
        return DimRule((labels,) + rest, (labels,), frozenset({"i"}), additive=frozenset({0}), flops=float(x.numel))
    return DimRule((labels,) + rest, (labels,), follower=True, flops=float(x.numel))


@register("aten.index_select")
def index_select(node: Node, graph: Graph) -> DimRule:
    x, idx = ins(node, graph)[:2]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    return DimRule((labels, (None,) * idx.ndim), (labels,), follower=True, flops=float(node.outputs[0].numel))


@register("aten.index_add")
def index_add(node: Node, graph: Graph) -> DimRule:
    """(x, dim, idx, src, alpha?): ``src`` rows along ``dim`` (one per index) may split: a Partial sum."""
    x, idx, src = ins(node, graph)[:3]
    dim = norm_dim(node.args[1], x.ndim)
    labels = _without(x.ndim, dim)
    src_labels = tuple("i" if d == dim else l for d, l in enumerate(labels))
    return DimRule((labels, ("i",) if idx.ndim == 1 else (None,) * idx.ndim, src_labels), (labels,),
                   frozenset({"i"}), additive=frozenset({0}), flops=float(src.numel))


@register("aten.index.Tensor")
def index(node: Node, graph: Graph) -> DimRule:
    """``x[idx0, ...]`` with leading tensor indices: out = broadcast(idx) dims + x's unindexed tail.

    A gather, like an embedding lookup: split index dims give split output rows (``x``
    whole), the tail dims split ``x`` and the output alike. When the output's shape is not
    ``broadcast(idx) + tail`` (``None`` entries in the index list, which the graph does
    not keep), only the tail may split.
    """
    metas = ins(node, graph)
    x, idx = metas[0], metas[1:]
    out = node.outputs[0]
    tail = dims("t", x.ndim - len(idx))
    lead = out.ndim - len(tail)
    x_labels = (None,) * len(idx) + tail
    bshape = out.shape[:lead]
    if lead >= 0 and out.shape[lead:] == x.shape[len(idx):] and all(m.ndim <= lead for m in idx):
        b = dims("b", lead)
        idx_labels = tuple(tuple(None if s == 1 and bshape[lead - m.ndim + i] != 1 else b[lead - m.ndim + i]
                                 for i, s in enumerate(m.shape)) for m in idx)
        return DimRule((x_labels,) + idx_labels, (b + tail,), flops=float(out.numel))
    idx_labels = tuple((None,) * m.ndim for m in idx)
    return DimRule((x_labels,) + idx_labels, ((None,) * max(0, lead) + tail,), follower=True, flops=float(out.numel))


@register("aten.index_put", "aten._unsafe_index_put", "aten._index_put_impl")
def index_put(node: Node, graph: Graph) -> DimRule:
    """``x[idx0, ...] = values`` (leading tensor indices): the unindexed trailing dims follow ``x``.

    The graph keeps only the index tensors, not where ``None`` (``:``) entries stood, so
    the indices are taken to name ``x``'s leading dims; the trailing dims split only
    where ``values`` has them at its end with ``x``'s sizes, otherwise everything stays whole.
    """
    metas = ins(node, graph)
    x, values, idx = metas[0], metas[-1], metas[1:-1]
    n_idx = len(idx)
    tail = dims("t", max(0, x.ndim - n_idx))
    fits = len(tail) <= values.ndim and values.shape[values.ndim - len(tail):] == x.shape[n_idx:]
    if not fits:
        tail = (None,) * len(tail)
    x_labels = (None,) * (x.ndim - len(tail)) + tail
    v_labels = (None,) * (values.ndim - len(tail)) + tail if values.ndim >= len(tail) else (None,) * values.ndim
    return DimRule((x_labels,) + tuple((None,) * m.ndim for m in idx) + (v_labels,), (x_labels,), follower=True,
                   flops=float(values.numel))
