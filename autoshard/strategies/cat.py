"""cat / stack and split: the concatenated (split) dim is never split across devices.

``cat`` skips a 1-d empty input beside higher-rank ones, as torch does (an empty KV cache
``torch.cat([torch.empty(0), new], dim=-2)``): it gets labels of its own rank, never split.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.cat")
def cat(node: Node, graph: Graph) -> DimRule:
    metas = ins(node, graph)
    out = node.outputs[0]
    dim = norm_dim(node.args[1] if len(node.args) > 1 and node.args[1] is not None else 0, out.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", out.ndim)))
    lead = max(range(len(metas)), key=lambda i: (metas[i].numel, node.inputs[i][0]))
    in_labels = tuple(labels if m.ndim == out.ndim else (None,) * m.ndim for m in metas)  # legacy empty: skipped
    return DimRule(in_labels, (labels,), follower=True, leader=lead, flops=float(out.numel))


@register("aten.stack")
def stack(node: Node, graph: Graph) -> DimRule:
    metas = ins(node, graph)
    out = node.outputs[0]
    dim = norm_dim(node.args[1] if len(node.args) > 1 and node.args[1] is not None else 0, out.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", out.ndim)))
    in_labels = labels[:dim] + labels[dim + 1:]
    return DimRule(tuple(in_labels for _ in metas), (labels,), follower=True, flops=float(out.numel))


@register("aten.split.Tensor", "aten.split_with_sizes", "aten.unbind.int", "aten.chunk")
def split(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    dim = norm_dim(node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0, x.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", x.ndim)))
    if node.op.startswith("aten.unbind"):
        outs = tuple(labels[:dim] + labels[dim + 1:] for _ in node.outputs)
    else:
        outs = tuple(labels for _ in node.outputs)
    return DimRule((labels,), outs, linear=True, follower=True, flops=0.0)
