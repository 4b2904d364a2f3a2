"""Matmul family: mm, addmm, bmm, baddbmm, the lazy core's linear. Contracting dims split -> Partial output."""
from __future__ import annotations

import math

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register

_K = frozenset({"k"})


@register("aten.mm")
def mm(node: Node, graph: Graph) -> DimRule:
    (m, k), (_, n) = (t.shape for t in ins(node, graph))
    return DimRule((("m", "k"), ("k", "n")), (("m", "n"),), _K, flops=2.0 * m * k * n)


@register("aten.addmm")
def addmm(node: Node, graph: Graph) -> DimRule:
    bias, a, b = ins(node, graph)
    (m, k), n = a.shape, b.shape[1]
    bias_labels = (("m", "n")[2 - bias.ndim:]) if bias.ndim else ()
    bias_labels = tuple(None if s == 1 else l for l, s in zip(bias_labels, bias.shape))
    return DimRule((bias_labels, ("m", "k"), ("k", "n")), (("m", "n"),), _K, additive=frozenset({0}),
                   flops=2.0 * m * k * n)


@register("aten.bmm")
def bmm(node: Node, graph: Graph) -> DimRule:
    (bs, m, k), (_, _, n) = (t.shape for t in ins(node, graph))
    return DimRule((("b", "m", "k"), ("b", "k", "n")), (("b", "m", "n"),), _K, flops=2.0 * bs * m * k * n)


@register("aten.baddbmm")
def baddbmm(node: Node, graph: Graph) -> DimRule:
    bias, a, b = ins(node, graph)
    (bs, m, k), n = a.shape, b.shape[2]
    labels = ("b", "m", "n")[3 - bias.ndim:]
    labels = tuple(None if s == 1 else l for l, s in zip(labels, bias.shape))
    return DimRule((labels, ("b", "m", "k"), ("b", "k", "n")), (("b", "m", "n"),), _K,
                   additive=frozenset({0}), flops=2.0 * bs * m * k * n)


@register("xla_dtensor.linear")
def linear(node: Node, graph: Graph) -> DimRule:
    """``input @ weight.T (+ bias)`` on an input of any rank >= 2 (:mod:`xla_dtensor.core.linear`)."""
    x, w, *bias = ins(node, graph)
    batch = tuple(None if s == 1 else label for label, s in zip(dims("b", x.ndim - 1), x.shape))
    labels = (batch + ("k",), ("n", "k")) + ((("n",),) if bias else ())
    return DimRule(labels, (batch + ("n",),), _K, additive=frozenset({2}) if bias else frozenset(),
                   flops=2.0 * math.prod(x.shape) * w.shape[0])


@register("xla_dtensor.linear_backward")
def linear_backward(node: Node, graph: Graph) -> DimRule:
    """The gradients of ``xla_dtensor.linear``: ``grad @ weight`` (contracts ``n``), ``grad.T @ input``
    and, with a bias, ``grad`` summed (both contract the leading dims); the bias gradient does not
    depend on ``k``."""
    g, x, w = ins(node, graph)
    batch = tuple(None if s == 1 else label for label, s in zip(dims("b", x.ndim - 1), x.shape))
    outs = (batch + ("k",), ("n", "k")) + ((("n",),) if len(node.outputs) == 3 else ())
    return DimRule((batch + ("n",), batch + ("k",), ("n", "k")), outs, frozenset({"n", *filter(None, batch)}),
                   independent=frozenset({(2, "k")}) if len(outs) == 3 else frozenset(),
                   flops=4.0 * math.prod(x.shape) * w.shape[0])
