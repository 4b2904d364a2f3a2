"""Scaled dot-product attention lowerings (the aten kernels F.scaled_dot_product_attention dispatches to).

One math core (softmax(q k^T * scale + mask) v, computed in float32 for half types)
serves the flash-for-CPU, efficient and math entry points; backward is its VJP.
Dropout inside these kernels is not supported (torch's PrivateUse1 path decomposes
SDPA with dropout into primitive ops, which are lowered individually).

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> q = jnp.ones((1, 2, 4, 8))
    >>> out, lse = get_lowering(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)(q, q, q)
    >>> out.shape, lse.shape
    ((1, 2, 4, 8), (1, 2, 4))
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.matmul import PRECISION
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _no_dropout(name: str, p: float) -> None:
    if p:
        raise NotImplementedError(f"{name}: dropout_p={p} inside the fused kernel is not lowered; "
                                  "use dropout_p=0 or the decomposed (math) path")


def _scores(q: jax.Array, k: jax.Array, attn_mask: Any, is_causal: bool, scale: float | None,
            enable_gqa: bool = True) -> jax.Array:
    c = to_jax(compute_type(torch_dtype(q)))
    if enable_gqa and k.ndim >= 3 and q.shape[-3] != k.shape[-3]:
        k = jnp.repeat(k, q.shape[-3] // k.shape[-3], axis=-3)
    s = (1.0 / math.sqrt(q.shape[-1])) if scale is None else scale
    scores = jnp.einsum("...le,...se->...ls", q.astype(c), k.astype(c), precision=PRECISION) * s
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        scores = jnp.where(jnp.tril(jnp.ones((L, S), jnp.bool_)), scores, -jnp.inf)
    if attn_mask is not None:
        if attn_mask.dtype == jnp.bool_:
            scores = jnp.where(attn_mask, scores, -jnp.inf)
        else:
            scores = scores + attn_mask.astype(c)
    return scores


def attention(q: jax.Array, k: jax.Array, v: jax.Array, attn_mask: Any = None, is_causal: bool = False,
              scale: float | None = None, enable_gqa: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(output, logsumexp over keys, attention weights); fully masked rows give 0 output."""
    scores = _scores(q, k, attn_mask, is_causal, scale, enable_gqa)
    c = scores.dtype
    if enable_gqa and v.ndim >= 3 and q.shape[-3] != v.shape[-3]:
        v = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3)
    m = jnp.max(scores, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0)
    e = jnp.exp(scores - m)
    denom = jnp.sum(e, axis=-1, keepdims=True)
    weights = jnp.where(denom > 0, e / jnp.where(denom > 0, denom, 1), 0)
    out = jnp.einsum("...ls,...se->...le", weights, v.astype(c), precision=PRECISION)
    lse = (jnp.log(denom) + m)[..., 0]
    return out.astype(q.dtype), lse, weights


@lowering(aten._scaled_dot_product_flash_attention_for_cpu.default)
def _sdpa_flash_cpu(q: jax.Array, k: jax.Array, v: jax.Array, dropout_p: float = 0.0, is_causal: bool = False, *,
                    attn_mask: Any = None, scale: float | None = None) -> tuple[jax.Array, jax.Array]:
    _no_dropout("_scaled_dot_product_flash_attention_for_cpu", dropout_p)
    out, lse, _ = attention(q, k, v, attn_mask, is_causal, scale)
    return out, lse.astype(jnp.float32 if q.dtype != jnp.float64 else q.dtype)


@lowering(aten._scaled_dot_product_flash_attention_for_cpu_backward.default)
def _sdpa_flash_cpu_backward(grad: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, out: jax.Array,
                             logsumexp: jax.Array, dropout_p: float, is_causal: bool, *, attn_mask: Any = None,
                             scale: float | None = None) -> tuple[jax.Array, jax.Array, jax.Array]:
    _no_dropout("_scaled_dot_product_flash_attention_for_cpu_backward", dropout_p)
    _, vjp = jax.vjp(lambda a, b, c: attention(a, b, c, attn_mask, is_causal, scale)[0], q, k, v)
    return vjp(grad.astype(q.dtype))


@lowering(aten._scaled_dot_product_efficient_attention.default)
def _sdpa_efficient(q: jax.Array, k: jax.Array, v: jax.Array, attn_bias: Any, compute_log_sumexp: bool,
                    dropout_p: float = 0.0, is_causal: bool = False, *,
                    scale: float | None = None) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    # NOTE: torch's CUDA kernel pads logsumexp's last dim to a multiple of 32; we return it unpadded.
    _no_dropout("_scaled_dot_product_efficient_attention", dropout_p)
    out, lse, _ = attention(q, k, v, attn_bias, is_causal, scale)
    lse = lse.astype(jnp.float32) if compute_log_sumexp else jnp.zeros(q.shape[:-2] + (0,), jnp.float32)
    return out, lse, jnp.zeros((), jnp.int64), jnp.zeros((), jnp.int64)


@lowering(aten._scaled_dot_product_efficient_attention_backward.default)
def _sdpa_efficient_backward(grad: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, attn_bias: Any,
                             out: jax.Array, logsumexp: jax.Array, philox_seed: Any, philox_offset: Any,
                             dropout_p: float, grad_input_mask: Any, is_causal: bool = False, *,
                             scale: float | None = None) -> tuple[Any, Any, Any, Any]:
    _no_dropout("_scaled_dot_product_efficient_attention_backward", dropout_p)
    if attn_bias is not None and grad_input_mask[3]:
        _, vjp = jax.vjp(lambda a, b, c, m: attention(a, b, c, m, is_causal, scale)[0], q, k, v, attn_bias)
        return tuple(vjp(grad.astype(q.dtype)))
    _, vjp = jax.vjp(lambda a, b, c: attention(a, b, c, attn_bias, is_causal, scale)[0], q, k, v)
    return (*vjp(grad.astype(q.dtype)), None)


@lowering(aten._scaled_dot_product_attention_math.default)
def _sdpa_math(q: jax.Array, k: jax.Array, v: jax.Array, attn_mask: Any = None, dropout_p: float = 0.0,
               is_causal: bool = False, dropout_mask: Any = None, *, scale: float | None = None,
               enable_gqa: bool = False) -> tuple[jax.Array, jax.Array]:
    if dropout_p and dropout_mask is None:
        _no_dropout("_scaled_dot_product_attention_math", dropout_p)
    out, _, weights = attention(q, k, v, attn_mask, is_causal, scale, enable_gqa)
    if dropout_p:
        weights = weights * dropout_mask / (1 - dropout_p)
        vv = jnp.repeat(v, q.shape[-3] // v.shape[-3], axis=-3) if enable_gqa else v
        out = jnp.einsum("...ls,...se->...le", weights, vv.astype(weights.dtype), precision=PRECISION)
    return out.astype(q.dtype), weights.astype(q.dtype)


@lowering(aten.scaled_dot_product_attention.default)
def _sdpa(q: jax.Array, k: jax.Array, v: jax.Array, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: float | None = None, enable_gqa: bool = False) -> jax.Array:
    _no_dropout("scaled_dot_product_attention", dropout_p)
    return attention(q, k, v, attn_mask, is_causal, scale, enable_gqa)[0]


del cast
