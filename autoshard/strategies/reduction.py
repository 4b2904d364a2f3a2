"""Reductions and the loss: reducing a split dim leaves a Partial sum (sum-like only)."""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


_DIM_POS = {"aten.linalg_vector_norm": 2, "aten.norm": 2}  # where the dims argument sits (default 1)


def _reduced_dims(node: Node, ndim: int) -> set[int]:
    pos = _DIM_POS.get(node.op.rsplit(".", 1)[0] if node.op.count(".") > 1 else node.op, 1)
    red = node.args[pos] if len(node.args) > pos else None
    if isinstance(red, bool) or not isinstance(red, (int, tuple, list)):
        return set(range(ndim))  # None, a flag (var.default's unbiased) or a norm's p: every dim
    return {norm_dim(d, ndim) for d in ((red,) if isinstance(red, int) else red)} or set(range(ndim))


def _reduce(node: Node, graph: Graph, partial: bool) -> DimRule:
    (x,) = ins(node, graph)[:1]
    red = _reduced_dims(node, x.ndim)
    keep = node.outputs[0].ndim == x.ndim > 0  # keepdim (a keyword-only argument in some overloads)
    labels = dims("d", x.ndim)
    reduced = tuple(labels[d] if partial else None for d in sorted(red))
    in_labels = tuple(None if d in red and not partial else l for d, l in enumerate(labels))
    out = tuple(None if d in red else l for d, l in enumerate(labels)) if keep else \
        tuple(l for d, l in enumerate(labels) if d not in red)
    outs = tuple(out if o.ndim == len(out) else (None,) * o.ndim for o in node.outputs)  # max.dim: values, indices
    return DimRule((in_labels,), outs, frozenset(l for l in reduced if l), linear=partial,
                   follower=True, flops=float(x.numel))


@register("aten.sum.dim_IntList", "aten.sum.default", "aten.nansum", "aten.count_nonzero")
def sum_(node: Node, graph: Graph) -> DimRule:
    return _reduce(node, graph, partial=True)


@register("aten.mean.dim", "aten.mean.default", "aten.amax", "aten.amin", "aten.max.dim", "aten.var_mean",
          "aten.prod", "aten.argmax", "aten.any", "aten.all", "aten.max.default", "aten.min.default", "aten.min.dim",
          "aten.argmin", "aten.var", "aten.std", "aten.std_mean", "aten.logsumexp", "aten.linalg_vector_norm",
          "aten.norm", "aten.median")
def other_reduce(node: Node, graph: Graph) -> DimRule:
    return _reduce(node, graph, partial=False)


@register("aten.nll_loss_forward")
def nll_loss_forward(node: Node, graph: Graph) -> DimRule:
    """(logp [N, C], target [N]) -> (loss, total_weight): N split -> Partial sums; C whole."""
    metas = ins(node, graph)
    n_lab = ("n",) if metas[0].ndim == 2 else ()
    in_labels = (n_lab + (None,), n_lab) + tuple(tuple(None for _ in m.shape) for m in metas[2:])
    return DimRule(in_labels, ((), ()), frozenset({"n"}), follower=True, flops=float(metas[1].numel))


@register("aten.nll_loss_backward")
def nll_loss_backward(node: Node, graph: Graph) -> DimRule:
    """(grad [], logp [N, C], target [N], weight?, ..., total_weight []) -> grad_logp [N, C]."""
    metas = ins(node, graph)
    labels = [tuple(None for _ in m.shape) for m in metas]
    if metas[1].ndim == 2:
        labels[1], labels[2] = ("n", None), ("n",)
    return DimRule(tuple(labels), (("n", None) if metas[1].ndim == 2 else (None,),), follower=True,
                   leader=1, flops=float(metas[1].numel))
