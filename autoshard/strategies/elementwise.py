"""Elementwise ops (with broadcasting): followers of their deepest operand.

Ops that are linear in a single tensor operand (negation, scaling, copies) pass a
``Partial`` leader through. Sums of tensors (``add.Tensor``, ``sub.Tensor``) are linear
in all operands jointly: a ``Partial`` leader makes every operand ``Partial`` and the sum
stays ``Partial``, so two partial gradients (a tied embedding's lookup and projection
parts, say) are reduced once, after the sum. The rest need a ``Partial`` leader reduced
first (an edge cost), except ``*_like`` ops, which read only a shape.
"""
from __future__ import annotations

from dataclasses import replace

from autoshard.graph import Graph, Node
from autoshard.strategies._util import broadcast_labels, deepest, dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register

LINEAR = ("aten.neg", "aten.mul.Scalar", "aten.div.Scalar", "aten.clone", "aten._to_copy",
          "aten.copy", "aten.alias", "aten.contiguous")
NONLINEAR = ("aten.add", "aten.sub", "aten.mul.Tensor", "aten.div.Tensor", "aten.rsub", "aten.exp",
             "aten.log", "aten.tanh", "aten.sigmoid", "aten.relu", "aten.gelu", "aten.gelu_backward",
             "aten.threshold_backward", "aten.sqrt", "aten.rsqrt", "aten.pow", "aten.where", "aten.abs",
             "aten.masked_fill", "aten.native_dropout", "aten.native_dropout_backward", "aten.silu",
             "aten.silu_backward", "aten.tanh_backward", "aten.sigmoid_backward", "aten.reciprocal",
             "aten.lerp", "aten.addcmul", "aten.addcdiv", "aten.maximum", "aten.minimum", "aten.eq",
             "aten.ne", "aten.lt", "aten.gt", "aten.le", "aten.ge", "aten.logical_not", "aten.erf",
             "aten.fill",
             "aten.add_", "aten.mul_", "aten.copy_", "aten.sub_", "aten.div_",
             "aten.cos", "aten.sin", "aten.fill_")
LIKE = ("aten.ones_like", "aten.zeros_like", "aten.full_like", "aten.empty_like", "aten.zero_", "aten.zero",
        "aten.rand_like", "aten.randn_like")  # read only a shape
SUM = ("aten.add.Tensor", "aten.sub.Tensor")  # overloads: their packets (add.Scalar, add_) stay NONLINEAR


def elementwise_rule(node: Node, graph: Graph, linear: bool = False, joint: bool = False) -> DimRule:
    """Output dims ``d0..``; each input right-aligned to them; follows the deepest input.

    ``linear``: linear in its one tensor operand; ``joint``: linear in all of its (two or
    more) tensor operands together (a sum; with a scalar operand it is affine, not linear).
    """
    metas = ins(node, graph)
    outs = node.outputs
    out = outs[0]
    in_labels = tuple(broadcast_labels(m, out) for m in metas)
    out_labels = tuple(dims("d", o.ndim) if o.shape == out.shape else tuple(None for _ in o.shape) for o in outs)
    lin = (linear and len(metas) == 1) or (joint and len(metas) >= 2)
    return DimRule(in_labels, out_labels, linear=lin, follower=True,
                   leader=deepest(node, graph) if metas else 0, flops=float(out.numel) * len(metas))


@register(*LINEAR)
def linear_elementwise(node: Node, graph: Graph) -> DimRule:
    return elementwise_rule(node, graph, linear=True)


@register(*NONLINEAR)
def nonlinear_elementwise(node: Node, graph: Graph) -> DimRule:
    return elementwise_rule(node, graph)


@register(*LIKE)
def like_elementwise(node: Node, graph: Graph) -> DimRule:
    """``ones_like(x)``: follows ``x``'s splits; a ``Partial`` ``x`` needs no reduction (values unread)."""
    return replace(elementwise_rule(node, graph), shape_only=True)


@register(*SUM)
def sum_elementwise(node: Node, graph: Graph) -> DimRule:
    return elementwise_rule(node, graph, joint=True)
