"""Normalization, softmax and loss lowerings (forward and backward).

Covers native_layer_norm(+backward), batch norm (functional forms), group norm,
_softmax/_log_softmax(+backward data), _safe_softmax, nll_loss(2d) forward/backward and
mse_loss(+backward). Half types compute in float32.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> out, mean, rstd = get_lowering(torch.ops.aten.native_layer_norm.default)(
    ...     jnp.ones((2, 4)), [4], None, None, 1e-5)
    >>> mean.shape
    (2, 1)
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering
from xla_dtensor.ops.shape import wrap_dim

aten = torch.ops.aten


@lowering(aten.native_layer_norm.default)
def _native_layer_norm(x: jax.Array, normalized_shape: Sequence[int], weight: jax.Array | None,
                       bias: jax.Array | None, eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    dt = torch_dtype(x)
    c = compute_type(dt)
    ax = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    y = cast(x, c)
    mean = jnp.mean(y, axis=ax, keepdims=True)
    var = jnp.mean(jnp.square(y - mean), axis=ax, keepdims=True)
    rstd = jax.lax.rsqrt(var + eps)
    out = (y - mean) * rstd
    if weight is not None:
        out = out * cast(weight, c)
    if bias is not None:
        out = out + cast(bias, c)
    stat = to_jax(dt if dt not in (torch.float16, torch.bfloat16) else dt)
    return out.astype(to_jax(dt)), mean.astype(stat), rstd.astype(stat)


@lowering(aten.native_layer_norm_backward.default)
def _native_layer_norm_backward(grad: jax.Array, x: jax.Array, normalized_shape: Sequence[int], mean: jax.Array,
                                rstd: jax.Array, weight: jax.Array | None, bias: jax.Array | None,
                                output_mask: Sequence[bool]) -> tuple[Any, Any, Any]:
    dt = torch_dtype(x)
    c = compute_type(dt)
    ax = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    batch = tuple(range(x.ndim - len(normalized_shape)))
    g, y, m, r = cast(grad, c), cast(x, c), cast(mean, c), cast(rstd, c)
    xhat = (y - m) * r
    dx = dw = db = None
    if output_mask[0]:
        gw = g * cast(weight, c) if weight is not None else g
        dx = r * (gw - jnp.mean(gw, axis=ax, keepdims=True) - xhat * jnp.mean(gw * xhat, axis=ax, keepdims=True))
        dx = dx.astype(to_jax(dt))
    if output_mask[1] and weight is not None:
        dw = jnp.sum(g * xhat, axis=batch).astype(weight.dtype)
    if output_mask[2] and bias is not None:
        db = jnp.sum(g, axis=batch).astype(bias.dtype)
    return dx, dw, db


def _softmax_dtype(x: jax.Array, half_to_float: bool) -> torch.dtype:
    dt = torch_dtype(x)
    return torch.float32 if (half_to_float and dt in (torch.float16, torch.bfloat16)) else dt


@lowering(aten._softmax.default)
def _softmax(x: jax.Array, dim: int, half_to_float: bool = False) -> jax.Array:
    out = _softmax_dtype(x, half_to_float)
    return jax.nn.softmax(cast(x, compute_type(out)), axis=wrap_dim(dim, x.ndim) if x.ndim else None) \
        .astype(to_jax(out))


@lowering(aten._log_softmax.default)
def _log_softmax(x: jax.Array, dim: int, half_to_float: bool = False) -> jax.Array:
    out = _softmax_dtype(x, half_to_float)
    return jax.nn.log_softmax(cast(x, compute_type(out)), axis=wrap_dim(dim, x.ndim) if x.ndim else None) \
        .astype(to_jax(out))


@lowering(aten._safe_softmax.default)
def _safe_softmax(x: jax.Array, dim: int, dtype: torch.dtype | None = None) -> jax.Array:
    out = dtype or torch_dtype(x)
    y = cast(x, compute_type(out))
    d = wrap_dim(dim, x.ndim) if x.ndim else None
    all_masked = jnp.all(y == -jnp.inf, axis=d, keepdims=True)
    return jnp.where(all_masked, 0, jax.nn.softmax(y, axis=d)).astype(to_jax(out))


@lowering(aten._softmax_backward_data.default)
def _softmax_backward_data(grad: jax.Array, out: jax.Array, dim: int, input_dtype: torch.dtype) -> jax.Array:
    c = compute_type(torch_dtype(grad))
    g, o = cast(grad, c), cast(out, c)
    d = wrap_dim(dim, grad.ndim) if grad.ndim else None
    return (o * (g - jnp.sum(g * o, axis=d, keepdims=True))).astype(to_jax(input_dtype))


@lowering(aten._log_softmax_backward_data.default)
def _log_softmax_backward_data(grad: jax.Array, out: jax.Array, dim: int, input_dtype: torch.dtype) -> jax.Array:
    c = compute_type(torch_dtype(grad))
    g, o = cast(grad, c), cast(out, c)
    d = wrap_dim(dim, grad.ndim) if grad.ndim else None
    return (g - jnp.exp(o) * jnp.sum(g, axis=d, keepdims=True)).astype(to_jax(input_dtype))


_REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}


def _nll_parts(x: jax.Array, target: jax.Array, weight: jax.Array | None, ignore_index: int) \
        -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per-element picked log-prob, per-element weight (0 where ignored), and the class axis."""
    cdim = 1 if x.ndim >= 2 else 0
    valid = target != ignore_index
    safe = jnp.where(valid, target, 0)
    picked = jnp.take_along_axis(x, jnp.expand_dims(safe, cdim), axis=cdim).squeeze(cdim) if x.ndim >= 2 \
        else x[safe]
    w = jnp.ones((), x.dtype) if weight is None else cast(weight, torch_dtype(x))[safe]
    w = jnp.where(valid, w, 0).astype(x.dtype)
    return picked, jnp.broadcast_to(w, picked.shape), safe


@lowering(aten.nll_loss_forward.default, aten.nll_loss2d_forward.default)
def _nll_loss_forward(x: jax.Array, target: jax.Array, weight: jax.Array | None, reduction: int,
                      ignore_index: int) -> tuple[jax.Array, jax.Array]:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"nll_loss: reduction={reduction}; allowed 0 (none), 1 (mean), 2 (sum)")
    dt = torch_dtype(x)
    c = to_jax(compute_type(dt))
    picked, w, _ = _nll_parts(x.astype(c), target, weight, ignore_index)
    losses = -picked * w
    total = jnp.sum(w)
    if reduction == 0:  # torch reports the weight of a single (1-d input) sample even unreduced
        return losses.astype(to_jax(dt)), (total if x.ndim == 1 else jnp.zeros((), c)).astype(to_jax(dt))
    out = jnp.sum(losses) / total if reduction == 1 else jnp.sum(losses)
    return out.astype(to_jax(dt)), total.astype(to_jax(dt))


@lowering(aten.nll_loss_backward.default, aten.nll_loss2d_backward.default)
def _nll_loss_backward(grad: jax.Array, x: jax.Array, target: jax.Array, weight: jax.Array | None, reduction: int,
                       ignore_index: int, total_weight: jax.Array) -> jax.Array:
    dt = torch_dtype(x)
    c = compute_type(dt)
    _, w, safe = _nll_parts(cast(x, c), target, weight, ignore_index)
    g = cast(grad, c)
    scale = -w * (g if reduction == 0 else g / cast(total_weight, c) if reduction == 1 else g)
    cdim = 1 if x.ndim >= 2 else 0
    onehot = jax.nn.one_hot(safe, x.shape[cdim], dtype=to_jax(c), axis=cdim)
    return (onehot * jnp.expand_dims(scale, cdim)).astype(to_jax(dt))


@lowering(aten.mse_loss.default)
def _mse_loss(x: jax.Array, target: jax.Array, reduction: int = 1) -> jax.Array:
    dt = torch_dtype(x)
    d = jnp.square(cast(x, compute_type(dt)) - cast(target, compute_type(dt)))
    out = d if reduction == 0 else jnp.mean(d) if reduction == 1 else jnp.sum(d)
    return out.astype(to_jax(dt))


@lowering(aten.mse_loss_backward.default)
def _mse_loss_backward(grad: jax.Array, x: jax.Array, target: jax.Array, reduction: int) -> jax.Array:
    dt = torch_dtype(x)
    c = compute_type(dt)
    scale = 2.0 / (x.size if reduction == 1 else 1)
    return (scale * (cast(x, c) - cast(target, c)) * cast(grad, c)).astype(to_jax(dt))


def _bn_stats(x: jax.Array, c: torch.dtype) -> tuple[jax.Array, jax.Array, tuple[int, ...]]:
    ax = (0,) + tuple(range(2, x.ndim))
    y = cast(x, c)
    return jnp.mean(y, axis=ax), jnp.var(y, axis=ax), ax


def _bn_apply(x: jax.Array, mean: jax.Array, invstd: jax.Array, weight: Any, bias: Any, c: torch.dtype) -> jax.Array:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    out = (cast(x, c) - mean.reshape(shape)) * invstd.reshape(shape)
    if weight is not None:
        out = out * cast(weight, c).reshape(shape)
    if bias is not None:
        out = out + cast(bias, c).reshape(shape)
    return out.astype(x.dtype)


@lowering(aten._native_batch_norm_legit_functional.default)
def _bn_functional(x: jax.Array, weight: Any, bias: Any, running_mean: jax.Array, running_var: jax.Array,
                   training: bool, momentum: float, eps: float) -> tuple[jax.Array, ...]:
    c = compute_type(torch_dtype(x))
    if not training:
        invstd = jax.lax.rsqrt(cast(running_var, c) + eps)
        out = _bn_apply(x, cast(running_mean, c), invstd, weight, bias, c)
        empty = jnp.zeros((0,), to_jax(c))
        return out, empty, empty, running_mean, running_var
    mean, var, _ = _bn_stats(x, c)
    invstd = jax.lax.rsqrt(var + eps)
    n = x.size // x.shape[1]
    new_mean = (1 - momentum) * cast(running_mean, c) + momentum * mean
    new_var = (1 - momentum) * cast(running_var, c) + momentum * var * n / max(n - 1, 1)
    return (_bn_apply(x, mean, invstd, weight, bias, c), mean, invstd,
            new_mean.astype(running_mean.dtype), new_var.astype(running_var.dtype))


@lowering(aten._native_batch_norm_legit_no_training.default)
def _bn_no_training(x: jax.Array, weight: Any, bias: Any, running_mean: jax.Array, running_var: jax.Array,
                    momentum: float, eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    out, m, v, _, _ = _bn_functional(x, weight, bias, running_mean, running_var, False, momentum, eps)
    return out, m, v


@lowering(aten._native_batch_norm_legit.no_stats)
def _bn_no_stats(x: jax.Array, weight: Any, bias: Any, training: bool, momentum: float,
                 eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    c = compute_type(torch_dtype(x))
    mean, var, _ = _bn_stats(x, c)
    invstd = jax.lax.rsqrt(var + eps)
    return _bn_apply(x, mean, invstd, weight, bias, c), mean, invstd


@lowering(aten.native_batch_norm_backward.default)
def _bn_backward(grad: jax.Array, x: jax.Array, weight: Any, running_mean: Any, running_var: Any, save_mean: Any,
                 save_invstd: Any, train: bool, eps: float, output_mask: Sequence[bool]) -> tuple[Any, Any, Any]:
    c = compute_type(torch_dtype(x))
    ax = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mean = cast(save_mean if train else running_mean, c)
    invstd = cast(save_invstd, c) if train else jax.lax.rsqrt(cast(running_var, c) + eps)
    g, y = cast(grad, c), cast(x, c)
    xhat = (y - mean.reshape(shape)) * invstd.reshape(shape)
    w = cast(weight, c).reshape(shape) if weight is not None else 1
    dx = dw = db = None
    if output_mask[0]:
        if train:
            dx = w * invstd.reshape(shape) * (g - jnp.mean(g, axis=ax, keepdims=True)
                                              - xhat * jnp.mean(g * xhat, axis=ax, keepdims=True))
        else:
            dx = g * w * invstd.reshape(shape)
        dx = dx.astype(x.dtype)
    if output_mask[1]:
        dw = jnp.sum(g * xhat, axis=ax).astype(weight.dtype if weight is not None else x.dtype)
    if output_mask[2]:
        db = jnp.sum(g, axis=ax).astype(weight.dtype if weight is not None else x.dtype)
    return dx, dw, db


@lowering(aten.native_group_norm.default)
def _native_group_norm(x: jax.Array, weight: Any, bias: Any, N: int, C: int, HxW: int, group: int,
                       eps: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    c = compute_type(torch_dtype(x))
    y = cast(x, c).reshape(N, group, -1)
    mean = jnp.mean(y, axis=-1)
    rstd = jax.lax.rsqrt(jnp.var(y, axis=-1) + eps)
    out = ((y - mean[..., None]) * rstd[..., None]).reshape(x.shape)
    shape = (1, C) + (1,) * (x.ndim - 2)
    if weight is not None:
        out = out * cast(weight, c).reshape(shape)
    if bias is not None:
        out = out + cast(bias, c).reshape(shape)
    return out.astype(x.dtype), mean.astype(x.dtype), rstd.astype(x.dtype)
