"""Factory lowerings: full/zeros/ones/empty, *_like, new_*, arange, linspace, eye, tril/triu, fill.

Factories take static sizes. ``empty`` returns zeros (its contents are unspecified in
torch). Default dtypes follow torch: Python ``bool`` fill -> bool, ``int`` -> int64,
``float`` -> the default float dtype; ``arange`` is int64 unless an argument is a float.

Example:
    >>> import torch
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.full.default)([2], 7).dtype
    dtype('int64')
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.cast import as_value
from xla_dtensor.ops.dtypes import default_float, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _scalar_dtype(value: Any) -> torch.dtype:
    dt = torch_dtype(value)
    if dt.is_floating_point:
        return default_float()
    if dt.is_complex:
        return torch.complex128 if default_float() == torch.float64 else torch.complex64
    return dt


def _full(size: Sequence[int], value: Any, dtype: torch.dtype) -> jax.Array:
    if any(s < 0 for s in size):
        raise ValueError(f"negative size in {list(size)}")
    return jnp.broadcast_to(as_value(value, dtype), tuple(size))


@lowering(aten.full.default)
def _full_op(size: Sequence[int], fill_value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, fill_value, dtype or _scalar_dtype(fill_value))


@lowering(aten.zeros.default)
def _zeros(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, 0, dtype or default_float())


@lowering(aten.empty.memory_format)
def _empty(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _zeros(size, dtype=dtype)


@lowering(aten.empty_strided.default)
def _empty_strided(size: Sequence[int], stride: Sequence[int], *, dtype: torch.dtype | None = None,
                   **_: Any) -> jax.Array:
    return _zeros(size, dtype=dtype)


@lowering(aten.ones.default)
def _ones(size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, 1, dtype or default_float())


@lowering(aten.scalar_tensor.default)
def _scalar_tensor(s: Any, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return as_value(s, dtype or default_float())


@lowering(aten.full_like.default)
def _full_like(x: jax.Array, fill_value: Any, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(x.shape, fill_value, dtype or torch_dtype(x))


@lowering(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(x.shape, 0, dtype or torch_dtype(x))


@lowering(aten.ones_like.default)
def _ones_like(x: jax.Array, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(x.shape, 1, dtype or torch_dtype(x))


@lowering(aten.new_full.default)
def _new_full(x: jax.Array, size: Sequence[int], fill_value: Any, *, dtype: torch.dtype | None = None,
              **_: Any) -> jax.Array:
    return _full(size, fill_value, dtype or torch_dtype(x))


@lowering(aten.new_zeros.default, aten.new_empty.default)
def _new_zeros(x: jax.Array, size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, 0, dtype or torch_dtype(x))


@lowering(aten.new_empty_strided.default)
def _new_empty_strided(x: jax.Array, size: Sequence[int], stride: Sequence[int], *,
                       dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, 0, dtype or torch_dtype(x))


@lowering(aten.new_ones.default)
def _new_ones(x: jax.Array, size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _full(size, 1, dtype or torch_dtype(x))


@lowering(aten.fill.Scalar, aten.fill.Tensor)
def _fill(x: jax.Array, value: Any) -> jax.Array:
    return _full(x.shape, value, torch_dtype(x))


@lowering(aten.zero.default)
def _zero(x: jax.Array) -> jax.Array:
    return _full(x.shape, 0, torch_dtype(x))


def _static(name: str, *values: Any) -> None:
    for v in values:
        if not isinstance(v, (int, float)):
            raise TypeError(f"{name}: arguments must be Python numbers (static), got {type(v).__name__} {v!r}")


@lowering(aten.arange.default, aten.arange.start, aten.arange.start_step)
def _arange(*args: Any, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) > 2 else 1)
    _static("arange", start, end, step)
    if step == 0:
        raise ValueError(f"arange: step must be nonzero (start={start}, end={end}, step={step})")
    n = max(math.ceil((end - start) / step), 0)
    if dtype is None:
        dtype = default_float() if any(isinstance(v, float) for v in (start, end, step)) else torch.int64
    values = start + np.arange(n, dtype=np.float64 if dtype.is_floating_point else np.int64) * step
    return jnp.asarray(values.astype(to_jax(dtype)))


@lowering(aten.linspace.default)
def _linspace(start: Any, end: Any, steps: int, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    if steps < 0:
        raise ValueError(f"linspace: steps must be >= 0, got {steps}")
    dt = dtype or default_float()
    acc = jnp.float64 if not dt.is_floating_point else to_jax(dt)
    i = jnp.arange(steps, dtype=acc)
    s, e = jnp.asarray(start, acc), jnp.asarray(end, acc)
    step = (e - s) / max(steps - 1, 1)
    out = jnp.where(i < steps // 2, s + i * step, e - (steps - 1 - i) * step) if steps > 1 else \
        jnp.broadcast_to(s, (steps,))
    return out.astype(to_jax(dt)) if dt.is_floating_point else jnp.trunc(out).astype(to_jax(dt))


@lowering(aten.eye.default, aten.eye.m)
def _eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return jnp.eye(n, n if m is None else m, dtype=to_jax(dtype or default_float()))


@lowering(aten.tril.default)
def _tril(x: jax.Array, diagonal: int = 0) -> jax.Array:
    return jnp.tril(x, diagonal)


@lowering(aten.triu.default)
def _triu(x: jax.Array, diagonal: int = 0) -> jax.Array:
    return jnp.triu(x, diagonal)


@lowering(aten.tril_indices.default)
def _tril_indices(row: int, col: int, offset: int = 0, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return jnp.asarray(np.stack(np.tril_indices(row, offset, col)), to_jax(dtype or torch.int64))


@lowering(aten.triu_indices.default)
def _triu_indices(row: int, col: int, offset: int = 0, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return jnp.asarray(np.stack(np.triu_indices(row, offset, col)), to_jax(dtype or torch.int64))
