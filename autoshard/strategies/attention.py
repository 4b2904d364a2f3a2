"""Fused attention (forward and backward): split batch and heads only.

Query length is not split (a causal mask would need per-shard offsets), nor the head
dim (it is contracted inside the softmax). Every fused form is one op here: torch's SDPA
(``aten.scaled_dot_product_attention`` and its ``_scaled_dot_product_*attention*``
kernels) and the lazy core's ``xla_dtensor.attention`` / ``xla_dtensor.attention_backward``.
Their memory is their outputs: O(T) per head (output and logsumexp), never the O(T^2)
score matrix a fused kernel keeps in on-chip tiles.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register

_FWD = ("aten._scaled_dot_product_flash_attention_for_cpu", "aten._scaled_dot_product_flash_attention",
        "aten._scaled_dot_product_efficient_attention", "aten._scaled_dot_product_cudnn_attention",
        "aten.scaled_dot_product_attention", "aten._scaled_dot_product_fused_attention_overrideable",
        "xla_dtensor.attention")
_BWD = ("aten._scaled_dot_product_flash_attention_for_cpu_backward",
        "aten._scaled_dot_product_flash_attention_backward",
        "aten._scaled_dot_product_efficient_attention_backward", "aten._scaled_dot_product_cudnn_attention_backward",
        "aten._scaled_dot_product_fused_attention_overrideable_backward", "xla_dtensor.attention_backward")


_Q = ("b", "h", None, None)  # query, key, value, output: [B, H, L, E]


def _labels(shape: tuple[int, ...], q_shape: tuple[int, ...]) -> tuple:
    """Batch/head labels of one operand: a logsumexp ``[B, H, L]``, or a tensor right-aligned
    against the query's ``[B, H, L, E]`` (masks and biases broadcast: their size-1 dims stay whole)."""
    if len(shape) == 3 and len(q_shape) == 4 and tuple(shape) == tuple(q_shape[:3]):
        labels: tuple = ("b", "h", None)
    elif len(shape) <= 4:
        labels = _Q[4 - len(shape):]
    else:
        labels = (None,) * len(shape)
    return tuple(None if d == 1 else label for d, label in zip(shape, labels))


def _flops(q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> float:
    b, h, lq, d = q_shape
    return 4.0 * b * h * lq * k_shape[2] * d


def _rule(node: Node, graph: Graph, scale: float) -> DimRule:
    metas = ins(node, graph)
    q = next(m for m in metas if m.ndim == 4).shape
    in_labels = tuple(_labels(m.shape, q) for m in metas)
    out_labels = tuple(_labels(o.shape, q) for o in node.outputs)
    return DimRule(in_labels, out_labels, flops=scale * _flops(q, q))


@register(*_FWD)
def sdpa(node: Node, graph: Graph) -> DimRule:
    return _rule(node, graph, 1.0)


@register(*_BWD)
def sdpa_backward(node: Node, graph: Graph) -> DimRule:
    return _rule(node, graph, 2.5)
