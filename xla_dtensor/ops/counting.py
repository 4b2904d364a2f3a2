"""Counting lowerings: ``histc`` and ``bincount`` (static length), as MoE routers use them.

``histc`` has a static output shape (``bins``) and lowers exactly as torch's CPU kernel
counts: the bin edges are ``torch.linspace(min, max, bins + 1)`` in the input's dtype,
an element goes to the last edge not above it (the top edge belongs to the last bin),
elements outside ``[min, max]`` and NaN are not counted, ``min == max`` means the data's
own range (widened by 1 on both sides when that is empty too). ``min``/``max`` may be
traced scalars (program parameters). Integer inputs are counted too (torch's CUDA
kernel allows them; its CPU kernel does not).

``bincount``'s length depends on the data (``max(input) + 1``). The lazy core reads the
input's range once on the host (``xla_dtensor.core.data_dependent``) and records the op
with ``minlength`` set to the final length; the lowering therefore treats ``minlength``
as the exact output length (values at or above it are dropped).

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.histc.default)(jnp.asarray([0., 1., 1., 3.]), 4, 0, 3).tolist()
    [1.0, 2.0, 0.0, 1.0]
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _edges(lo: jax.Array, hi: jax.Array, bins: int) -> jax.Array:
    """``torch.linspace(lo, hi, bins + 1)`` with torch's CPU formula (both ends exact)."""
    idx = jnp.arange(bins + 1, dtype=lo.dtype)
    step = (hi - lo) / bins
    return jnp.where(jnp.arange(bins + 1) < (bins + 1) // 2, lo + step * idx, hi - step * (bins - idx))


def _range(x: jax.Array, lo: jax.Array, hi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """torch's histogram range: the data's range when ``min == max``, widened by 1 when empty."""
    same = lo == hi
    if x.size:
        lo = jnp.where(same, jnp.min(x), lo)
        hi = jnp.where(same, jnp.max(x), hi)
    empty = lo == hi
    return jnp.where(empty, lo - 1, lo), jnp.where(empty, hi + 1, hi)


@lowering(aten.histc.default)
def _histc(x: jax.Array, bins: int = 100, min: Any = 0, max: Any = 0) -> jax.Array:  # noqa: A002
    dt = torch_dtype(x)
    c = to_jax(dt) if dt.is_floating_point else jnp.float64
    v = x if dt.is_floating_point else cast(x, torch.float64)
    lo, hi = _range(v, jnp.asarray(min, c), jnp.asarray(max, c))
    flat = v.reshape(-1)
    pos = jnp.searchsorted(_edges(lo, hi, bins), flat, side="right") - 1
    pos = jnp.minimum(pos, bins - 1)
    valid = (flat >= lo) & (flat <= hi)
    counts = jnp.zeros((bins,), jnp.float32 if dt in (torch.float16, torch.bfloat16) else to_jax(dt))
    return counts.at[jnp.where(valid, pos, 0)].add(valid.astype(counts.dtype)).astype(to_jax(dt))


def bincount_dtype(weights: jax.Array | None) -> torch.dtype:
    """torch's result dtype: int64 counts, float32 sums of float32 weights, else float64."""
    if weights is None:
        return torch.int64
    return torch.float32 if torch_dtype(weights) == torch.float32 else torch.float64


@lowering(aten.bincount.default)
def _bincount(x: jax.Array, weights: jax.Array | None = None, minlength: int = 0) -> jax.Array:
    out = bincount_dtype(weights)
    vals = jnp.ones(x.shape, to_jax(out)) if weights is None else cast(weights, out)
    return jnp.zeros((minlength,), to_jax(out)).at[x].add(vals, mode="drop")
