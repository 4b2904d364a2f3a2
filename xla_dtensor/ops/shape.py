"""View and shape lowerings: view/reshape, permute, expand, slice/select, cat/stack/split, pad.

Views are values here: a lowering returns the viewed data, and the caller keeps
aliasing. Static arguments (sizes, dims, start/end) are Python ints.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.view.default)(jnp.zeros((2, 6)), [3, -1]).shape
    (3, 4)
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.dtypes import cast, result_type
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def wrap_dim(dim: int, ndim: int) -> int:
    """Normalize a possibly negative ``dim`` for a tensor of rank ``ndim`` (0-d counts as 1-d).

    Example:
        >>> wrap_dim(-1, 3)
        2
    """
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dim {dim} out of range for a tensor of rank {ndim} (allowed [{-n}, {n - 1}])")
    return dim % n


@lowering(aten.view.default, aten._unsafe_view.default, aten.view_copy.default, aten.reshape.default,
          aten._reshape_alias.default, aten._reshape_copy.default)
def _view(x: jax.Array, size: Sequence[int], stride: Sequence[int] | None = None) -> jax.Array:
    return jnp.reshape(x, tuple(size))


@lowering(aten.alias.default, aten.detach.default, aten.lift_fresh.default, aten.lift_fresh_copy.default,
          aten.alias_copy.default, aten.detach_copy.default, aten.lift.default)
def _identity(x: jax.Array, *_: Any) -> jax.Array:
    return x


@lowering(aten.view.dtype)
def _view_dtype(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    from xla_dtensor.ops.dtypes import to_jax
    return jax.lax.bitcast_convert_type(x, to_jax(dtype)) if np.dtype(to_jax(dtype)).itemsize == x.dtype.itemsize \
        else _bitcast_resize(x, to_jax(dtype))


def _bitcast_resize(x: jax.Array, dt: np.dtype) -> jax.Array:
    src, dst = x.dtype.itemsize, np.dtype(dt).itemsize
    if src > dst:
        y = jax.lax.bitcast_convert_type(x, dt)
        return y.reshape(*x.shape[:-1], x.shape[-1] * (src // dst))
    y = x.reshape(*x.shape[:-1], x.shape[-1] * src // dst, dst // src)
    return jax.lax.bitcast_convert_type(y, dt)


@lowering(aten.permute.default, aten.permute_copy.default)
def _permute(x: jax.Array, dims: Sequence[int]) -> jax.Array:
    return jnp.transpose(x, [wrap_dim(d, x.ndim) for d in dims]) if x.ndim else x


@lowering(aten.t.default, aten.t_copy.default, aten.numpy_T.default)
def _t(x: jax.Array) -> jax.Array:
    if x.ndim > 2:
        raise ValueError(f"t() expects a tensor with <= 2 dimensions, got shape {x.shape}")
    return x.T


@lowering(aten.transpose.int, aten.transpose_copy.int)
def _transpose(x: jax.Array, dim0: int, dim1: int) -> jax.Array:
    if x.ndim == 0:
        return x
    return jnp.swapaxes(x, wrap_dim(dim0, x.ndim), wrap_dim(dim1, x.ndim))


@lowering(aten.expand.default, aten.expand_copy.default)
def _expand(x: jax.Array, size: Sequence[int], *, implicit: bool = False) -> jax.Array:
    lead = len(size) - x.ndim
    if lead < 0:
        raise ValueError(f"expand: the number of sizes ({len(size)}) must be >= the tensor's rank ({x.ndim})")
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, shape)


def _slice_bounds(n: int, start: int | None, end: int | None) -> tuple[int, int]:
    start = 0 if start is None else start
    end = n if end is None else end
    start = start + n if start < 0 else start
    end = end + n if end < 0 else end
    start = min(max(start, 0), n)
    return start, min(max(end, start), n)


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(x: jax.Array, dim: int = 0, start: int | None = None, end: int | None = None, step: int = 1) -> jax.Array:
    d = wrap_dim(dim, x.ndim)
    s, e = _slice_bounds(x.shape[d], start, end)
    if step <= 0:
        raise ValueError(f"slice: step must be positive, got {step}")
    return jax.lax.slice_in_dim(x, s, e, step, axis=d) if e > s else \
        jnp.zeros(x.shape[:d] + (0,) + x.shape[d + 1:], x.dtype)


@lowering(aten.select.int, aten.select_copy.int)
def _select(x: jax.Array, dim: int, index: int) -> jax.Array:
    d = wrap_dim(dim, x.ndim)
    n = x.shape[d]
    if not -n <= index < n:
        raise IndexError(f"select: index {index} out of range for dim {dim} of size {n}")
    return jax.lax.index_in_dim(x, index % n, axis=d, keepdims=False)


@lowering(aten.narrow.default, aten.narrow_copy.default)
def _narrow(x: jax.Array, dim: int, start: int, length: int) -> jax.Array:
    d = wrap_dim(dim, x.ndim)
    start = start + x.shape[d] if start < 0 else start
    return jax.lax.slice_in_dim(x, start, start + length, axis=d)


@lowering(aten.cat.default)
def _cat(tensors: Sequence[jax.Array], dim: int = 0) -> jax.Array:
    dt = result_type(*[t for t in tensors]) if len(tensors) else torch.float32
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]  # torch skips legacy empty 1-d
    if not kept:
        return cast(tensors[0], dt)
    d = wrap_dim(dim, kept[0].ndim)
    return jnp.concatenate([cast(t, dt) for t in kept], axis=d)


@lowering(aten.stack.default)
def _stack(tensors: Sequence[jax.Array], dim: int = 0) -> jax.Array:
    dt = result_type(*tensors)
    return jnp.stack([cast(t, dt) for t in tensors], axis=wrap_dim(dim, tensors[0].ndim + 1))


@lowering(aten.hstack.default)
def _hstack(tensors: Sequence[jax.Array]) -> jax.Array:
    return _cat([jnp.atleast_1d(t) for t in tensors], 0 if jnp.atleast_1d(tensors[0]).ndim == 1 else 1)


def _split_at(x: jax.Array, sizes: Sequence[int], dim: int) -> list[jax.Array]:
    d = wrap_dim(dim, x.ndim)
    if sum(sizes) != x.shape[d]:
        raise ValueError(f"split_with_sizes: sizes {list(sizes)} do not sum to dim {dim}'s size {x.shape[d]}")
    out, at = [], 0
    for s in sizes:
        out.append(jax.lax.slice_in_dim(x, at, at + s, axis=d))
        at += s
    return out


@lowering(aten.split.Tensor, aten.split_copy.Tensor, aten.unsafe_split.Tensor)
def _split(x: jax.Array, split_size: int, dim: int = 0) -> list[jax.Array]:
    n = x.shape[wrap_dim(dim, x.ndim)]
    if n == 0:
        return [x]
    sizes = [min(split_size, n - i) for i in range(0, n, split_size)]
    return _split_at(x, sizes, dim)


@lowering(aten.split_with_sizes.default, aten.split_with_sizes_copy.default, aten.unsafe_split_with_sizes.default)
def _split_with_sizes(x: jax.Array, split_sizes: Sequence[int], dim: int = 0) -> list[jax.Array]:
    return _split_at(x, split_sizes, dim)


@lowering(aten.unbind.int, aten.unbind_copy.int)
def _unbind(x: jax.Array, dim: int = 0) -> list[jax.Array]:
    d = wrap_dim(dim, x.ndim)
    return [jax.lax.index_in_dim(x, i, axis=d, keepdims=False) for i in range(x.shape[d])]


@lowering(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
          aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def _squeeze(x: jax.Array, dim: int | Sequence[int] | None = None) -> jax.Array:
    if x.ndim == 0:
        return x
    dims = range(x.ndim) if dim is None else [dim] if isinstance(dim, int) else dim
    axes = tuple(sorted({wrap_dim(d, x.ndim) for d in dims if x.shape[wrap_dim(d, x.ndim)] == 1}))
    return jnp.squeeze(x, axes) if axes else x


@lowering(aten.unsqueeze.default, aten.unsqueeze_copy.default)
def _unsqueeze(x: jax.Array, dim: int) -> jax.Array:
    return jnp.expand_dims(x, wrap_dim(dim, x.ndim + 1))


@lowering(aten.flip.default)
def _flip(x: jax.Array, dims: Sequence[int]) -> jax.Array:
    return jnp.flip(x, tuple(wrap_dim(d, x.ndim) for d in dims)) if x.ndim and dims else x


@lowering(aten.roll.default)
def _roll(x: jax.Array, shifts: Sequence[int], dims: Sequence[int] = ()) -> jax.Array:
    if not dims:
        return jnp.roll(x.reshape(-1), tuple(shifts)[0]).reshape(x.shape)
    return jnp.roll(x, tuple(shifts), tuple(wrap_dim(d, x.ndim) for d in dims))


@lowering(aten.repeat.default)
def _repeat(x: jax.Array, repeats: Sequence[int]) -> jax.Array:
    lead = len(repeats) - x.ndim
    if lead < 0:
        raise ValueError(f"repeat: {len(repeats)} repeats for a tensor of rank {x.ndim}; need >= rank")
    return jnp.tile(x.reshape((1,) * lead + x.shape), tuple(repeats))


@lowering(aten.constant_pad_nd.default)
def _constant_pad_nd(x: jax.Array, pad: Sequence[int], value: Any = 0) -> jax.Array:
    if len(pad) % 2 or len(pad) // 2 > x.ndim:
        raise ValueError(f"constant_pad_nd: pad {list(pad)} must have even length <= 2 * rank ({x.ndim})")
    cfg = [(0, 0, 0)] * x.ndim
    for i in range(len(pad) // 2):
        cfg[x.ndim - 1 - i] = (pad[2 * i], pad[2 * i + 1], 0)
    return jax.lax.pad(x, cast(value, _dtype_of(x)), cfg)


def _dtype_of(x: jax.Array) -> torch.dtype:
    from xla_dtensor.ops.dtypes import torch_dtype
    return torch_dtype(x)


@lowering(aten.diagonal.default, aten.diagonal_copy.default)
def _diagonal(x: jax.Array, offset: int = 0, dim1: int = 0, dim2: int = 1) -> jax.Array:
    return jnp.diagonal(x, offset, wrap_dim(dim1, x.ndim), wrap_dim(dim2, x.ndim))


@lowering(aten.unfold.default, aten.unfold_copy.default)
def _unfold(x: jax.Array, dimension: int, size: int, step: int) -> jax.Array:
    if x.ndim == 0:
        return x.reshape(1)
    d = wrap_dim(dimension, x.ndim)
    count = (x.shape[d] - size) // step + 1
    idx = np.arange(count)[:, None] * step + np.arange(size)[None, :]
    y = jnp.take(x, idx.reshape(-1), axis=d).reshape(x.shape[:d] + (count, size) + x.shape[d + 1:])
    return jnp.moveaxis(y, d + 1, -1)


@lowering(aten.as_strided.default, aten.as_strided_copy.default)
def _as_strided(x: jax.Array, size: Sequence[int], stride: Sequence[int], storage_offset: int | None = None) -> jax.Array:
    # NOTE: assumes ``x`` is its own contiguous storage (the caller materializes views first).
    idx = np.full(tuple(size), storage_offset or 0, dtype=np.int64)
    for d, (n, s) in enumerate(zip(size, stride)):
        idx = idx + (np.arange(n) * s).reshape((1,) * d + (n,) + (1,) * (len(size) - d - 1))
    return jnp.take(x.reshape(-1), jnp.asarray(idx))
