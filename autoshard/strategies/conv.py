"""Convolution (forward, backward), batch norm and pooling: batch and channel splits, spatial dims whole.

``convolution(x [N, Ci, *S], w [Co, Ci/g, *K], bias [Co]?) -> [N, Co, *S']`` (``w`` is
``[Ci, Co/g, *K]`` when transposed): split ``N`` (data parallel), ``Co`` (output
channels: ``w`` and ``bias`` split) or ``Ci`` (input channels: a ``Partial`` output, the
bias added once). Grouped convolutions (``groups > 1``) split the batch only.
``convolution_backward`` mirrors it: a batch split leaves ``Partial`` weight and bias
gradients, an output-channel split a ``Partial`` input gradient; the bias gradient does
not depend on the input channels, so an input-channel split leaves it whole.

Batch norm in training normalizes over the batch and spatial dims: splitting them costs
one all-reduce of the per-channel statistics inside the op (``DimRule.internal``), after
which the statistics (and, backward, the weight and bias gradients) are whole; channels
split freely. Pooling splits the leading (batch, channel) dims.
"""
from __future__ import annotations

import math

from autoshard.graph import Graph, Node, TensorMeta
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register

def _conv_args(node: Node, first: int) -> tuple[bool, int]:
    """``(transposed, groups)`` from positional args starting at ``stride`` (index ``first``)."""
    args = node.args
    transposed = bool(args[first + 3]) if len(args) > first + 3 else False
    groups = int(args[first + 5]) if len(args) > first + 5 and isinstance(args[first + 5], int) else 1
    return transposed, groups


def _labels(x: TensorMeta, w: TensorMeta, out: TensorMeta, transposed: bool, groups: int) -> tuple:
    sp = (None,) * (x.ndim - 2)
    ci, co = ("ci", "co") if groups == 1 else (None, None)
    x_l, out_l = ("n", ci) + sp, ("n", co) + sp
    w_l = ((ci, co) if transposed else (co, ci)) + (None,) * (w.ndim - 2)
    return x_l, w_l, out_l


def _conv_flops(x: TensorMeta, w: TensorMeta, out: TensorMeta, transposed: bool) -> float:
    """Each element of the output (of the input, transposed) reads ``w.shape[1] * prod(kernel)`` products."""
    return 2.0 * (x if transposed else out).numel * w.shape[1] * math.prod(w.shape[2:])


@register("aten.convolution")
def convolution(node: Node, graph: Graph) -> DimRule:
    """(x, w, bias?, stride, padding, dilation, transposed, output_padding, groups) -> out."""
    metas = ins(node, graph)
    x, w, out = metas[0], metas[1], node.outputs[0]
    transposed, groups = _conv_args(node, 3)
    x_l, w_l, out_l = _labels(x, w, out, transposed, groups)
    in_labels = (x_l, w_l) + ((("co",) if groups == 1 else (None,)),) * (len(metas) - 2)
    partial = frozenset({"ci"}) if groups == 1 else frozenset()
    return DimRule(in_labels, (out_l,), partial, additive=frozenset({2}) if len(metas) > 2 else frozenset(),
                   flops=_conv_flops(x, w, out, transposed))


@register("aten.convolution_backward")
def convolution_backward(node: Node, graph: Graph) -> DimRule:
    """(grad_out, x, w, bias_sizes, stride, ..., groups, output_mask) -> (grad_x, grad_w, grad_bias)."""
    g, x, w = ins(node, graph)[:3]
    transposed, groups = _conv_args(node, 4)
    x_l, w_l, out_l = _labels(x, w, g, transposed, groups)
    outs = []
    for j, o in enumerate(node.outputs):  # outputs the mask drops are 0-d placeholders
        want = (x_l, w_l, (("co",) if groups == 1 else (None,)))[j] if j < 3 else ()
        outs.append(want if len(want) == o.ndim else (None,) * o.ndim)
    labels = {l for t in (x_l, w_l, out_l) for l in t if l}
    independent = frozenset({(2, "ci")}) if groups == 1 and len(node.outputs) > 2 else frozenset()
    return DimRule((out_l, x_l, w_l), tuple(outs), frozenset(labels), independent=independent,
                   flops=2.0 * _conv_flops(x, w, g, transposed))


def _bn_labels(x: TensorMeta) -> tuple[tuple, tuple, frozenset[str]]:
    """Input labels (batch ``n``, channel ``c``, spatial ``s0..``), channel labels, reduced labels."""
    x_l = ("n", "c") + dims("s", x.ndim - 2)
    return x_l, ("c",), frozenset(l for l in x_l if l != "c")


def _stats_bytes(x: TensorMeta) -> float:
    return 2.0 * x.shape[1] * 4  # per-channel sum and sum of squares, float32


@register("aten._native_batch_norm_legit_functional", "aten._native_batch_norm_legit", "aten.native_batch_norm",
          "aten._native_batch_norm_legit_no_training", "aten.batch_norm")
def batch_norm(node: Node, graph: Graph) -> DimRule:
    """(x, w?, b?, running_mean?, running_var?, training, ...) -> (out, stats...)."""
    metas = ins(node, graph)
    x = metas[0]
    x_l, c_l, reduced = _bn_labels(x)
    training = node.op.split(".")[1] != "_native_batch_norm_legit_no_training" and _training(node)
    in_labels = (x_l,) + tuple(c_l if m.ndim == 1 else (None,) * m.ndim for m in metas[1:])
    outs = tuple(x_l if o.shape == x.shape else c_l if o.ndim == 1 else (None,) * o.ndim for o in node.outputs)
    if not training:  # running statistics: elementwise over batch and spatial dims
        outs = tuple(x_l if o.shape == x.shape else (None,) * o.ndim for o in node.outputs)
        return DimRule(in_labels, outs, flops=4.0 * x.numel)
    return DimRule(in_labels, outs, internal=reduced, internal_bytes=_stats_bytes(x), flops=8.0 * x.numel)


def _training(node: Node) -> bool:
    flags = [a for a in node.args if isinstance(a, bool)]
    return flags[0] if flags else True


@register("aten.native_batch_norm_backward")
def batch_norm_backward(node: Node, graph: Graph) -> DimRule:
    """(grad, x, w?, running_mean?, running_var?, save_mean?, save_invstd?, train, eps, mask) -> (gx, gw, gb)."""
    metas = ins(node, graph)
    g, x = metas[0], metas[1]
    x_l, c_l, reduced = _bn_labels(x)
    in_labels = (x_l, x_l) + tuple(c_l if m.ndim == 1 else (None,) * m.ndim for m in metas[2:])
    outs = tuple(x_l if o.shape == x.shape else c_l if o.ndim == 1 else (None,) * o.ndim for o in node.outputs)
    if not _training(node):  # running statistics: the weight and bias gradients are plain sums over the batch
        return DimRule(in_labels, outs, reduced, flops=6.0 * x.numel)
    return DimRule(in_labels, outs, internal=reduced, internal_bytes=_stats_bytes(x), flops=12.0 * x.numel)


_POOL = ("aten.max_pool2d_with_indices", "aten.max_pool2d_with_indices_backward", "aten.avg_pool2d",
         "aten.avg_pool2d_backward", "aten._adaptive_avg_pool2d", "aten._adaptive_avg_pool2d_backward",
         "aten.adaptive_avg_pool2d", "aten.max_pool2d", "aten.max_pool3d_with_indices", "aten.avg_pool3d",
         "aten._adaptive_avg_pool3d", "aten.avg_pool1d", "aten.max_pool1d")


@register(*_POOL)
def pool(node: Node, graph: Graph) -> DimRule:
    """Every tensor's leading (batch, channel) dims follow the first input; the pooled dims stay whole."""
    metas = ins(node, graph)
    n_sp = 3 if "3d" in node.op else 1 if "1d" in node.op else 2
    lead = max(0, metas[0].ndim - n_sp)

    def labels(m: TensorMeta) -> tuple:
        return dims("d", lead) + (None,) * n_sp if m.ndim == lead + n_sp else (None,) * m.ndim

    return DimRule(tuple(labels(m) for m in metas), tuple(labels(o) for o in node.outputs), follower=True,
                   flops=float(max(m.numel for m in metas)))
