"""Convolution and pooling lowerings: convolution(+backward), max/avg pool 2d(+backward), adaptive avg pool.

Backward ops are the VJP of the forward lowering (``jax.vjp``), except
max_pool2d_with_indices_backward, which scatters to the recorded indices exactly
as torch does. Pooling windows are gathered with static index tables.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> conv = get_lowering(torch.ops.aten.convolution.default)
    >>> conv(jnp.ones((1, 2, 5, 5)), jnp.ones((3, 2, 3, 3)), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1).shape
    (1, 3, 3, 3)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.matmul import PRECISION
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _expand(v: Sequence[int] | int, n: int) -> tuple[int, ...]:
    v = [v] if isinstance(v, int) else list(v)
    return tuple(v * n if len(v) == 1 else v)


def _conv(x: jax.Array, w: jax.Array, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
          transposed: bool, output_padding: Sequence[int], groups: int) -> jax.Array:
    n = x.ndim - 2
    stride, padding, dilation = _expand(stride, n), _expand(padding, n), _expand(dilation, n)
    spatial = "DHW"[-n:] if n <= 3 else None
    if spatial is None:
        raise ValueError(f"convolution: {n} spatial dims; supported 1-3 (input shape {x.shape})")
    dn = ("NC" + spatial, "OI" + spatial, "NC" + spatial)
    acc = jnp.float32 if x.dtype in (jnp.bfloat16, jnp.float16) else None
    if not transposed:
        return jax.lax.conv_general_dilated(x, w, stride, [(p, p) for p in padding], rhs_dilation=dilation,
                                            dimension_numbers=dn, feature_group_count=groups,
                                            precision=PRECISION, preferred_element_type=acc)
    # transposed: w is (in, out/groups, k...); flip spatially and swap in/out per group
    cin, cout_g, ks = w.shape[0], w.shape[1], w.shape[2:]
    wt = w.reshape((groups, cin // groups, cout_g) + ks).swapaxes(1, 2).reshape((groups * cout_g, cin // groups) + ks)
    wt = jnp.flip(wt, tuple(range(2, 2 + n)))
    output_padding = _expand(output_padding, n)
    pads = [(d * (k - 1) - p, d * (k - 1) - p + op) for k, p, d, op in zip(ks, padding, dilation, output_padding)]
    return jax.lax.conv_general_dilated(x, wt, (1,) * n, pads, lhs_dilation=stride, rhs_dilation=dilation,
                                        dimension_numbers=dn, feature_group_count=groups,
                                        precision=PRECISION, preferred_element_type=acc)


@lowering(aten.convolution.default)
def _convolution(x: jax.Array, weight: jax.Array, bias: jax.Array | None, stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], transposed: bool, output_padding: Sequence[int],
                 groups: int) -> jax.Array:
    dt = torch_dtype(x)
    out = _conv(x, weight, stride, padding, dilation, transposed, output_padding, groups)
    if bias is not None:
        out = out + cast(bias, torch_dtype(out)).reshape((1, -1) + (1,) * (x.ndim - 2))
    return out.astype(to_jax(dt))


@lowering(aten.convolution_backward.default)
def _convolution_backward(grad: jax.Array, x: jax.Array, weight: jax.Array, bias_sizes: Sequence[int] | None,
                          stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                          output_padding: Sequence[int], groups: int,
                          output_mask: Sequence[bool]) -> tuple[Any, Any, Any]:
    def fwd(a: jax.Array, b: jax.Array) -> jax.Array:
        return _conv(a, b, stride, padding, dilation, transposed, output_padding, groups).astype(a.dtype)
    _, vjp = jax.vjp(fwd, x, weight)
    dx, dw = vjp(grad.astype(x.dtype))
    db = None
    if output_mask[2]:
        ax = (0,) + tuple(range(2, grad.ndim))
        db = jnp.sum(cast(grad, compute_type(torch_dtype(grad))), axis=ax).astype(grad.dtype)
    return (dx if output_mask[0] else None), (dw if output_mask[1] else None), db


def _out_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    num = size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil_mode else 0)
    out = num // s + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    return out


def _pool_args(x: jax.Array, kernel: Sequence[int], stride: Sequence[int], padding: Any, dilation: Any) -> tuple:
    k = _expand(kernel, 2)
    s = _expand(stride, 2) if stride else k
    return k, s, _expand(padding, 2), _expand(dilation, 2)


def _windows(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> np.ndarray:
    """(out, k) input positions of every window along one axis (may be out of [0, size))."""
    out = _out_size(size, k, s, p, d, ceil_mode)
    return np.arange(out)[:, None] * s - p + np.arange(k)[None, :] * d


def _gather_windows(x: jax.Array, rows: np.ndarray, cols: np.ndarray, fill: Any) -> jax.Array:
    """x[..., H, W] -> [..., OH, OW, kh*kw] with ``fill`` outside the input."""
    h, w = x.shape[-2:]
    r = rows[:, None, :, None]
    c = cols[None, :, None, :]
    valid = (r >= 0) & (r < h) & (c >= 0) & (c < w)
    flat = np.where(valid, np.clip(r, 0, h - 1) * w + np.clip(c, 0, w - 1), 0)
    oh, ow, kh, kw = flat.shape
    vals = jnp.take(x.reshape(x.shape[:-2] + (h * w,)), flat.reshape(-1), axis=-1)
    vals = vals.reshape(x.shape[:-2] + (oh, ow, kh * kw))
    return jnp.where(valid.reshape(oh, ow, kh * kw), vals, fill), flat.reshape(oh, ow, kh * kw)


@lowering(aten.max_pool2d_with_indices.default)
def _max_pool2d_with_indices(x: jax.Array, kernel_size: Sequence[int], stride: Sequence[int] = (),
                             padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False) -> tuple[jax.Array, jax.Array]:
    k, s, p, d = _pool_args(x, kernel_size, stride, padding, dilation)
    rows = _windows(x.shape[-2], k[0], s[0], p[0], d[0], ceil_mode)
    cols = _windows(x.shape[-1], k[1], s[1], p[1], d[1], ceil_mode)
    low = -jnp.inf if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype).min
    vals, flat = _gather_windows(x, rows, cols, low)
    # NaN wins, as in torch: argmax treats NaN as the maximum
    arg = jnp.argmax(vals, axis=-1)
    out = jnp.take_along_axis(vals, arg[..., None], axis=-1)[..., 0]
    idx = jnp.take_along_axis(jnp.broadcast_to(jnp.asarray(flat), vals.shape), arg[..., None], axis=-1)[..., 0]
    return out, idx.astype(jnp.int64)


@lowering(aten.max_pool2d_with_indices_backward.default)
def _max_pool2d_with_indices_backward(grad: jax.Array, x: jax.Array, kernel_size: Any, stride: Any, padding: Any,
                                      dilation: Any, ceil_mode: bool, indices: jax.Array) -> jax.Array:
    lead = x.shape[:-2]
    hw = x.shape[-2] * x.shape[-1]
    g = grad.reshape(-1, grad.shape[-2] * grad.shape[-1])
    idx = indices.reshape(g.shape)
    rows = jnp.arange(g.shape[0])[:, None]
    out = jnp.zeros((g.shape[0], hw), to_jax(compute_type(torch_dtype(grad))))
    out = out.at[rows, idx].add(g.astype(out.dtype))
    return out.reshape(lead + x.shape[-2:]).astype(grad.dtype)


def _avg_pool2d(x: jax.Array, kernel_size: Sequence[int], stride: Sequence[int] = (), padding: Any = 0,
                ceil_mode: bool = False, count_include_pad: bool = True,
                divisor_override: int | None = None) -> jax.Array:
    k, s, p, _ = _pool_args(x, kernel_size, stride, padding, 1)
    h, w = x.shape[-2:]
    rows = _windows(h, k[0], s[0], p[0], 1, ceil_mode)
    cols = _windows(w, k[1], s[1], p[1], 1, ceil_mode)
    c = compute_type(torch_dtype(x))
    vals, _ = _gather_windows(cast(x, c), rows, cols, 0)
    if divisor_override:
        div = np.full((rows.shape[0], cols.shape[0]), divisor_override)
    else:
        def extent(starts: np.ndarray, size: int, kk: int, pp: int) -> tuple[np.ndarray, np.ndarray]:
            st = starts[:, 0]
            end = np.minimum(st + kk, size + pp)
            return end - st, np.minimum(end, size) - np.maximum(st, 0)
        full_r, valid_r = extent(rows, h, k[0], p[0])
        full_c, valid_c = extent(cols, w, k[1], p[1])
        div = np.outer(full_r, full_c) if count_include_pad else np.outer(valid_r, valid_c)
    out = jnp.sum(vals, axis=-1) / jnp.asarray(div, vals.dtype)
    return out.astype(x.dtype)


lowering(aten.avg_pool2d.default)(_avg_pool2d)


@lowering(aten.avg_pool2d_backward.default)
def _avg_pool2d_backward(grad: jax.Array, x: jax.Array, kernel_size: Any, stride: Any, padding: Any, ceil_mode: bool,
                         count_include_pad: bool, divisor_override: int | None) -> jax.Array:
    _, vjp = jax.vjp(lambda a: _avg_pool2d(a, kernel_size, stride, padding, ceil_mode, count_include_pad,
                                           divisor_override), x)
    return vjp(grad)[0]


def _adaptive_matrix(size: int, out: int) -> np.ndarray:
    m = np.zeros((out, size))
    for i in range(out):
        start, end = (i * size) // out, math.ceil((i + 1) * size / out)
        m[i, start:end] = 1.0 / (end - start)
    return m


@lowering(aten._adaptive_avg_pool2d.default, aten.adaptive_avg_pool2d.default)
def _adaptive_avg_pool2d(x: jax.Array, output_size: Sequence[int]) -> jax.Array:
    c = compute_type(torch_dtype(x))
    oh, ow = _expand(output_size, 2)
    mh = jnp.asarray(_adaptive_matrix(x.shape[-2], oh), to_jax(c))
    mw = jnp.asarray(_adaptive_matrix(x.shape[-1], ow), to_jax(c))
    out = jnp.einsum("oh,...hw,pw->...op", mh, cast(x, c), mw, precision=jax.lax.Precision.HIGHEST)
    return out.astype(x.dtype)


@lowering(aten._adaptive_avg_pool2d_backward.default)
def _adaptive_avg_pool2d_backward(grad: jax.Array, x: jax.Array) -> jax.Array:
    _, vjp = jax.vjp(lambda a: _adaptive_avg_pool2d(a, grad.shape[-2:]), x)
    return vjp(grad)[0]
