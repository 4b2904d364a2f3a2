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


def _labels(meta_ndim: int, shape: tuple[int, ...]) -> tuple:
    if meta_ndim == 4:
        return ("b", "h", None, None)
    if meta_ndim == 3:
        return ("b", "h", None)  # logsumexp [B, H, L]
    return tuple(None for _ in shape)


def _flops(q_shape: tuple[int, ...], k_shape: tuple[int, ...]) -> float:
    b, h, lq, d = q_shape
    return 4.0 * b * h * lq * k_shape[2] * d


def _rule(node: Node, graph: Graph, scale: float) -> DimRule:
    metas = ins(node, graph)
    in_labels = tuple(_labels(m.ndim, m.shape) for m in metas)
    out_labels = tuple(_labels(o.ndim, o.shape) for o in node.outputs)
    qi = next(i for i, m in enumerate(metas) if m.ndim == 4)
    return DimRule(in_labels, out_labels, flops=scale * _flops(metas[qi].shape, metas[qi].shape))


@register(*_FWD)
def sdpa(node: Node, graph: Graph) -> DimRule:
    return _rule(node, graph, 1.0)


@register(*_BWD)
def sdpa_backward(node: Node, graph: Graph) -> DimRule:
    return _rule(node, graph, 2.5)
