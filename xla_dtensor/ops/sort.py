"""Sorting and scan lowerings: sort, argsort, topk, kthvalue, median, cumsum/cumprod, cummax/cummin.

Sorting is stable and orders NaN above every number (torch's order); descending
sorts reverse the key (``-x`` for floats, ``~x`` for integers) and stay stable.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> v, i = get_lowering(torch.ops.aten.sort.default)(jnp.asarray([3, 1, 2]))
    >>> v.tolist(), i.tolist()
    ([1, 2, 3], [1, 2, 0])
"""
from __future__ import annotations

from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.reduction import _sum_dtype
from xla_dtensor.ops.registry import lowering
from xla_dtensor.ops.shape import wrap_dim

aten = torch.ops.aten


def _keys(x: jax.Array, descending: bool) -> tuple[jax.Array, ...]:
    """Ascending sort keys; NaN is largest ascending and first descending (torch's order)."""
    if x.dtype == jnp.bool_:
        return (jnp.logical_not(x) if descending else x,)
    if jnp.issubdtype(x.dtype, jnp.integer):
        return (jnp.bitwise_not(x) if descending else x,)
    # lax.sort canonicalizes NaN to +NaN (above +inf): descending needs NaN first explicitly
    return (jnp.logical_not(jnp.isnan(x)), -x) if descending else (x,)


def sort(x: jax.Array, dim: int = -1, descending: bool = False) -> tuple[jax.Array, jax.Array]:
    """Stable sort along ``dim``: (values, int64 indices)."""
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    d = wrap_dim(dim, x.ndim)
    keys = _keys(x, descending)
    iota = jax.lax.broadcasted_iota(jnp.int64, x.shape, d)
    idx = jax.lax.sort((*keys, iota), dimension=d, is_stable=True, num_keys=len(keys))[-1]
    return jnp.take_along_axis(x, idx, axis=d), idx


@lowering(aten.sort.default)
def _sort(x: jax.Array, dim: int = -1, descending: bool = False) -> tuple[jax.Array, jax.Array]:
    return sort(x, dim, descending)


@lowering(aten.sort.stable)
def _sort_stable(x: jax.Array, *, stable: bool | None = None, dim: int = -1,
                 descending: bool = False) -> tuple[jax.Array, jax.Array]:
    return sort(x, dim, descending)


@lowering(aten.argsort.default, aten.argsort.stable)
def _argsort(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
    if "stable" in kwargs:
        return sort(x, kwargs.get("dim", -1), kwargs.get("descending", False))[1]
    dim = args[0] if args else kwargs.get("dim", -1)
    descending = args[1] if len(args) > 1 else kwargs.get("descending", False)
    return sort(x, dim, descending)[1]


@lowering(aten.topk.default)
def _topk(x: jax.Array, k: int, dim: int = -1, largest: bool = True,
          sorted: bool = True) -> tuple[jax.Array, jax.Array]:  # noqa: A002
    n = x.shape[wrap_dim(dim, x.ndim)] if x.ndim else 1
    if not 0 <= k <= n:
        raise ValueError(f"topk: k={k} out of range for dim {dim} of size {n}")
    v, i = sort(x, dim, descending=largest)
    if x.ndim == 0:
        return v, i
    d = wrap_dim(dim, x.ndim)
    return jax.lax.slice_in_dim(v, 0, k, axis=d), jax.lax.slice_in_dim(i, 0, k, axis=d)


@lowering(aten.kthvalue.default)
def _kthvalue(x: jax.Array, k: int, dim: int = -1, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    v, i = sort(x, dim)
    if x.ndim == 0:
        return v, i
    d = wrap_dim(dim, x.ndim)
    return (jax.lax.index_in_dim(v, k - 1, axis=d, keepdims=keepdim),
            jax.lax.index_in_dim(i, k - 1, axis=d, keepdims=keepdim))


@lowering(aten.median.dim)
def _median_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    n = x.shape[wrap_dim(dim, x.ndim)] if x.ndim else 1
    return _kthvalue(x, (n + 1) // 2, dim, keepdim)


@lowering(aten.median.default)
def _median(x: jax.Array) -> jax.Array:
    return _kthvalue(x.reshape(-1), (x.size + 1) // 2, 0)[0]


def _scan_dtype(x: jax.Array, dtype: torch.dtype | None) -> torch.dtype:
    return _sum_dtype(x, dtype)


@lowering(aten.cumsum.default)
def _cumsum(x: jax.Array, dim: int, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = _scan_dtype(x, dtype)
    y = cast(x, compute_type(out))
    if x.ndim == 0:
        return y.astype(to_jax(out))
    return jnp.cumsum(y, axis=wrap_dim(dim, x.ndim)).astype(to_jax(out))


@lowering(aten.cumprod.default)
def _cumprod(x: jax.Array, dim: int, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = _scan_dtype(x, dtype)
    y = cast(x, compute_type(out))
    if x.ndim == 0:
        return y.astype(to_jax(out))
    return jnp.cumprod(y, axis=wrap_dim(dim, x.ndim)).astype(to_jax(out))


@lowering(aten.logcumsumexp.default)
def _logcumsumexp(x: jax.Array, dim: int) -> jax.Array:
    dt = torch_dtype(x)
    y = cast(x, compute_type(dt))
    if x.ndim == 0:
        return x
    return jax.lax.cumlogsumexp(y, axis=wrap_dim(dim, x.ndim)).astype(x.dtype)


def _cum_extreme(x: jax.Array, dim: int, is_max: bool) -> tuple[jax.Array, jax.Array]:
    if x.ndim == 0:
        return x, jnp.zeros((), jnp.int64)
    return _cum_scan(x, wrap_dim(dim, x.ndim), is_max)


@partial(jax.jit, static_argnums=(1, 2))  # one fused scan when called eagerly; inlined under a trace
def _cum_scan(x: jax.Array, d: int, is_max: bool) -> tuple[jax.Array, jax.Array]:
    idx = jax.lax.broadcasted_iota(jnp.int64, x.shape, d)
    isfloat = jnp.issubdtype(x.dtype, jnp.floating)

    def combine(a: tuple[jax.Array, jax.Array], b: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        better = (b[0] >= a[0]) if is_max else (b[0] <= a[0])
        if isfloat:  # NaN sticks and the index follows the latest NaN, as in torch
            better = jnp.isnan(b[0]) | (~jnp.isnan(a[0]) & better)
        return jnp.where(better, b[0], a[0]), jnp.where(better, b[1], a[1])

    return jax.lax.associative_scan(combine, (x, idx), axis=d)


@lowering(aten.cummax.default)
def _cummax(x: jax.Array, dim: int) -> tuple[jax.Array, jax.Array]:
    return _cum_extreme(x, dim, True)


@lowering(aten.cummin.default)
def _cummin(x: jax.Array, dim: int) -> tuple[jax.Array, jax.Array]:
    return _cum_extreme(x, dim, False)


@lowering(aten.searchsorted.Tensor)
def _searchsorted(sorted_sequence: jax.Array, x: jax.Array, *, out_int32: bool = False, right: bool = False,
                  side: str | None = None, sorter: Any = None) -> jax.Array:
    side = side or ("right" if right else "left")
    if sorter is not None:
        sorted_sequence = jnp.take_along_axis(sorted_sequence, sorter, axis=-1)
    if sorted_sequence.ndim == 1:
        out = jnp.searchsorted(sorted_sequence, x, side=side)
    else:
        out = jax.vmap(lambda s, v: jnp.searchsorted(s, v, side=side))(
            sorted_sequence.reshape(-1, sorted_sequence.shape[-1]), x.reshape(-1, x.shape[-1])).reshape(x.shape)
    return out.astype(jnp.int32 if out_int32 else jnp.int64)
