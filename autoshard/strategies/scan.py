"""Ops along one dim (sort, topk, scans): that dim stays whole, the others follow the input.

``topk`` / ``sort`` / ``argsort`` / ``kthvalue`` and the scans (``cumsum``...) read a whole
row of their dim, so splitting it would need the other devices' rows; every other dim
(batch, tokens) splits freely. MoE routing picks each token's experts with ``topk`` over
the expert dim, so the token dim keeps its data-parallel split.

Example:
    >>> from autoshard.graph import Graph, TensorMeta
    >>> g = Graph()
    >>> x = g.add("placeholder", (), (TensorMeta((64, 8)),), role="input", name="router_probs")
    >>> v = g.add("aten.topk.default", ((x, 0),), (TensorMeta((64, 2)), TensorMeta((64, 2), "int64")), (None, 2, -1))
    >>> along_dim(g.nodes[v], g).outputs
    (('d0', None), ('d0', None))
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register

# op packet -> position of its dim argument and its default
_DIM_AT = {"aten.topk": (2, -1), "aten.sort": (1, -1), "aten.argsort": (1, -1), "aten.kthvalue": (2, -1),
           "aten.cumsum": (1, None), "aten.cumprod": (1, None), "aten.cummax": (1, None),
           "aten.cummin": (1, None), "aten.logcumsumexp": (1, None), "aten.msort": (None, 0)}


@register(*_DIM_AT)
def along_dim(node: Node, graph: Graph) -> DimRule:
    """Follows the input; the dim the op works along is never split (a 0-d input: nothing to split)."""
    (x,) = ins(node, graph)[:1]
    packet = node.op.rsplit(".", 1)[0] if node.op.count(".") > 1 else node.op
    pos, default = _DIM_AT[packet]
    dim = node.args[pos] if pos is not None and len(node.args) > pos and isinstance(node.args[pos], int) \
        and not isinstance(node.args[pos], bool) else default
    if dim is None:  # a required dim the graph did not record: keep every dim whole
        return DimRule(tuple((None,) * m.ndim for m in ins(node, graph)), tuple((None,) * o.ndim for o in node.outputs),
                       follower=True, flops=4.0 * max(1, x.numel))
    labels = dims("d", x.ndim)
    if x.ndim:
        d = norm_dim(dim, x.ndim)
        labels = tuple(None if i == d else l for i, l in enumerate(labels))
    outs = tuple(labels if o.ndim == x.ndim else _dropped(labels, o.ndim, x.ndim) for o in node.outputs)
    return DimRule((labels,) + tuple((None,) * m.ndim for m in ins(node, graph)[1:]), outs, follower=True,
                   flops=4.0 * max(1, x.numel))


def _dropped(labels: tuple, ndim: int, x_ndim: int) -> tuple:
    """Labels of an output that lost the (unsplit) dim: ``kthvalue(keepdim=False)``."""
    if ndim == x_ndim - 1:
        return tuple(l for l in labels if l is not None) if labels.count(None) == 1 else (None,) * ndim
    return (None,) * ndim
