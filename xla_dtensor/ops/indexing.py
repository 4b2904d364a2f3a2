"""Indexing lowerings: index/index_put, gather/scatter, index_select/add/copy/fill, embedding, *_scatter.

Integer advanced indexing follows NumPy rules, which torch shares. Boolean masks
make data-dependent shapes, so ``index`` with a bool mask only works on concrete
arrays (eager calls); under a trace it raises ``NotImplementedError``.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.gather.default)(jnp.arange(6).reshape(2, 3), 1, jnp.asarray([[2], [0]])).tolist()
    [[2], [3]]
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering
from xla_dtensor.ops.shape import _slice_bounds, wrap_dim

aten = torch.ops.aten


def _index_tuple(indices: Sequence[jax.Array | None]) -> tuple[Any, ...]:
    out: list[Any] = []
    for idx in indices:
        if idx is None:
            out.append(slice(None))
        elif idx.dtype in (jnp.bool_, jnp.uint8):
            if isinstance(idx, jax.core.Tracer):
                raise NotImplementedError(
                    f"index with a boolean mask of shape {idx.shape} has a data-dependent result shape; "
                    "it cannot be traced (use torch.where / masked_fill instead)")
            out.extend(jnp.nonzero(idx.astype(jnp.bool_)))
        else:
            out.append(idx)
    return tuple(out)


@lowering(aten.index.Tensor, aten._unsafe_index.Tensor)
def _index(x: jax.Array, indices: Sequence[jax.Array | None]) -> jax.Array:
    return x[_index_tuple(indices)]


@lowering(aten.index_put.default, aten._unsafe_index_put.default, aten._index_put_impl.default)
def _index_put(x: jax.Array, indices: Sequence[jax.Array | None], values: jax.Array, accumulate: bool = False,
               unsafe: bool = False) -> jax.Array:
    idx = _index_tuple(indices)
    v = cast(values, torch_dtype(x))
    return x.at[idx].add(v) if accumulate else x.at[idx].set(v)


@lowering(aten.take.default)
def _take(x: jax.Array, index: jax.Array) -> jax.Array:
    return jnp.take(x.reshape(-1), index)


@lowering(aten.index_select.default)
def _index_select(x: jax.Array, dim: int, index: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return jnp.take(x.reshape(1), index.reshape(-1)).reshape(x.shape)
    return jnp.take(x, index.reshape(-1), axis=wrap_dim(dim, x.ndim))


def _along(index: jax.Array, dim: int) -> tuple[jax.Array, ...]:
    """Full index tuple for gather/scatter: ``index`` on ``dim``, iotas elsewhere."""
    grids = list(jnp.indices(index.shape, sparse=True)) if index.ndim else []
    if not grids:
        return (index,)
    grids[dim] = index
    return tuple(grids)


@lowering(aten.gather.default)
def _gather(x: jax.Array, dim: int, index: jax.Array, *, sparse_grad: bool = False) -> jax.Array:
    if x.ndim == 0:
        return x.reshape(1)[index.reshape(-1)].reshape(index.shape)
    return x[_along(index, wrap_dim(dim, x.ndim))]


def _scatter(x: jax.Array, dim: int, index: jax.Array, src: Any, reduce: str | None) -> jax.Array:
    if index.size == 0:
        return x
    if x.ndim == 0:
        x1 = _scatter(x.reshape(1), 0, index.reshape(-1), src if not hasattr(src, "reshape") else src.reshape(-1),
                      reduce)
        return x1.reshape(())
    idx = _along(index, wrap_dim(dim, x.ndim))
    if hasattr(src, "ndim") and src.ndim and not getattr(src, "weak_type", False):
        src = src[tuple(slice(0, n) for n in index.shape)]
    v = cast(src, torch_dtype(x))
    ref = x.at[idx]
    if reduce is None:
        return ref.set(v)
    if reduce in ("add", "sum"):
        return ref.add(v) if x.dtype != jnp.bool_ else ref.max(v)
    if reduce in ("multiply", "prod"):
        return ref.multiply(v) if x.dtype != jnp.bool_ else ref.min(v)
    if reduce == "amax":
        return ref.max(v)
    if reduce == "amin":
        return ref.min(v)
    raise ValueError(f"scatter: reduce={reduce!r}; allowed: 'add', 'multiply', 'sum', 'prod', 'mean', 'amax', 'amin'")


@lowering(aten.scatter.src, aten.scatter.value)
def _scatter_op(x: jax.Array, dim: int, index: jax.Array, src: Any) -> jax.Array:
    return _scatter(x, dim, index, src, None)


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def _scatter_reduce_legacy(x: jax.Array, dim: int, index: jax.Array, src: Any, *, reduce: str) -> jax.Array:
    return _scatter(x, dim, index, src, reduce)


@lowering(aten.scatter_add.default)
def _scatter_add(x: jax.Array, dim: int, index: jax.Array, src: jax.Array) -> jax.Array:
    return _scatter(x, dim, index, src, "add")


_IDENTITY = {"sum": 0, "mean": 0, "prod": 1}


@lowering(aten.scatter_reduce.two)
def _scatter_reduce(x: jax.Array, dim: int, index: jax.Array, src: jax.Array, reduce: str, *,
                    include_self: bool = True) -> jax.Array:
    if reduce not in ("sum", "prod", "mean", "amax", "amin"):
        raise ValueError(f"scatter_reduce: reduce={reduce!r}; allowed: 'sum', 'prod', 'mean', 'amax', 'amin'")
    if not include_self:
        ident = _IDENTITY.get(reduce)
        if ident is None:
            info = jnp.finfo(x.dtype) if jnp.issubdtype(x.dtype, jnp.floating) else jnp.iinfo(x.dtype)
            ident = info.min if reduce == "amax" else info.max
        base = _scatter(x, dim, index, jnp.full(index.shape, ident, x.dtype), None)
    else:
        base = x
    if reduce != "mean":
        return _scatter(base, dim, index, src, reduce)
    total = _scatter(base, dim, index, src, "sum")
    count = _scatter(jnp.full(x.shape, 1 if include_self else 0, x.dtype), dim, index,
                     jnp.ones(index.shape, x.dtype), "sum")
    count = jnp.where(count == 0, 1, count)
    if jnp.issubdtype(x.dtype, jnp.floating):
        return total / count
    return jnp.floor_divide(total, count)


def _dim_index(x: jax.Array, dim: int, index: jax.Array) -> tuple[Any, ...]:
    d = wrap_dim(dim, x.ndim)
    return (slice(None),) * d + (index.reshape(-1),)


@lowering(aten.index_add.default)
def _index_add(x: jax.Array, dim: int, index: jax.Array, source: jax.Array, *, alpha: Any = 1) -> jax.Array:
    if x.ndim == 0:
        return x + cast(source, torch_dtype(x)).reshape(()) * alpha
    src = cast(source, torch_dtype(x))
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        src = src * cast(alpha, torch_dtype(x))
    return x.at[_dim_index(x, dim, index)].add(src)


@lowering(aten.index_copy.default)
def _index_copy(x: jax.Array, dim: int, index: jax.Array, source: jax.Array) -> jax.Array:
    if x.ndim == 0:
        return cast(source, torch_dtype(x)).reshape(())
    return x.at[_dim_index(x, dim, index)].set(cast(source, torch_dtype(x)))


@lowering(aten.index_fill.int_Scalar, aten.index_fill.int_Tensor)
def _index_fill(x: jax.Array, dim: int, index: jax.Array, value: Any) -> jax.Array:
    if x.ndim == 0:
        return cast(value, torch_dtype(x)).reshape(())
    return x.at[_dim_index(x, dim, index)].set(cast(value, torch_dtype(x)))


@lowering(aten.embedding.default)
def _embedding(weight: jax.Array, indices: jax.Array, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> jax.Array:
    return jnp.take(weight, indices, axis=0)


@lowering(aten.embedding_dense_backward.default)
def _embedding_dense_backward(grad: jax.Array, indices: jax.Array, num_weights: int, padding_idx: int,
                              scale_grad_by_freq: bool) -> jax.Array:
    dt = torch_dtype(grad)
    flat = indices.reshape(-1)
    g = cast(grad, compute_type(dt)).reshape(flat.shape[0], -1)
    if padding_idx >= 0:
        g = jnp.where((flat == padding_idx)[:, None], 0, g)
    if scale_grad_by_freq:
        counts = jnp.zeros((num_weights,), g.dtype).at[flat].add(1)
        g = g / counts[flat][:, None]
    out = jnp.zeros((num_weights, g.shape[1]), g.dtype).at[flat].add(g)
    return out.astype(to_jax(dt))


@lowering(aten.select_scatter.default)
def _select_scatter(x: jax.Array, src: jax.Array, dim: int, index: int) -> jax.Array:
    d = wrap_dim(dim, x.ndim)
    return x.at[(slice(None),) * d + (index,)].set(cast(src, torch_dtype(x)))


@lowering(aten.slice_scatter.default)
def _slice_scatter(x: jax.Array, src: jax.Array, dim: int = 0, start: int | None = None, end: int | None = None,
                   step: int = 1) -> jax.Array:
    d = wrap_dim(dim, x.ndim)
    s, e = _slice_bounds(x.shape[d], start, end)
    return x.at[(slice(None),) * d + (slice(s, e, step),)].set(cast(src, torch_dtype(x)))


@lowering(aten.diagonal_scatter.default)
def _diagonal_scatter(x: jax.Array, src: jax.Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> jax.Array:
    d1, d2 = wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim)
    moved = jnp.moveaxis(x, (d1, d2), (-2, -1))
    n, m = moved.shape[-2:]
    rows = np.arange(max(0, -offset), min(n, m - offset))
    moved = moved.at[..., rows, rows + offset].set(cast(src, torch_dtype(x)))
    return jnp.moveaxis(moved, (-2, -1), (d1, d2))


@lowering(aten.select_backward.default)
def _select_backward(grad: jax.Array, input_sizes: Sequence[int], dim: int, index: int) -> jax.Array:
    return _select_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, dim, index)


@lowering(aten.slice_backward.default)
def _slice_backward(grad: jax.Array, input_sizes: Sequence[int], dim: int, start: int, end: int,
                    step: int) -> jax.Array:
    return _slice_scatter(jnp.zeros(tuple(input_sizes), grad.dtype), grad, dim, start, end, step)


@lowering(aten.masked_scatter.default)
def _masked_scatter(x: jax.Array, mask: jax.Array, source: jax.Array) -> jax.Array:
    m = jnp.broadcast_to(mask, x.shape).reshape(-1)
    pos = jnp.cumsum(m.astype(jnp.int64)) - 1
    taken = jnp.take(source.reshape(-1), jnp.clip(pos, 0, max(source.size - 1, 0)))
    return jnp.where(m, cast(taken, torch_dtype(x)), x.reshape(-1)).reshape(x.shape)


@lowering(aten.nonzero.default)
def _nonzero(x: jax.Array) -> jax.Array:
    if isinstance(x, jax.core.Tracer):
        raise NotImplementedError(f"nonzero on a traced tensor of shape {x.shape}: the result shape is data-dependent")
    return jnp.stack(jnp.nonzero(x), axis=1).astype(jnp.int64) if x.ndim else \
        jnp.zeros((int(x != 0), 0), jnp.int64)


@lowering(aten.nonzero_static.default)
def _nonzero_static(x: jax.Array, *, size: int, fill_value: int = -1) -> jax.Array:
    if x.ndim == 0:
        return jnp.full((size, 0), fill_value, jnp.int64)
    return jnp.stack(jnp.nonzero(x, size=size, fill_value=fill_value), axis=1).astype(jnp.int64)
