"""Counting lowerings: ``histc``, ``histogram``, ``bincount`` and ``repeat_interleave`` (static lengths).

``histc`` and ``histogram`` have static output shapes and count as torch's CPU kernel
does. The range is ``[min, max]`` (``histc``: the data's own when ``min == max``, widened
by 1 on each side when that is empty too; ``histogram``: ``range``, else the data's,
widened by 0.5 when empty), with edges ``torch.linspace(lo, hi, bins + 1)``. ``histc``
puts ``x`` in bin ``trunc((x - lo) * bins / (hi - lo))`` computed in the input dtype;
``histogram`` in the last bin whose left edge is not above ``x``. The top edge belongs
to the last bin; values outside the range and NaN are not counted. ``min``/``max`` may
be traced scalars (program parameters). Integer inputs to ``histc`` are counted too
(torch's CUDA kernel allows them; its CPU kernel does not).

``bincount`` and ``repeat_interleave(repeats)`` have lengths that depend on the data
(``max(input) + 1``, ``sum(repeats)``). The lazy core reads that length once on the host
(``xla_dtensor.core.data_dependent``) unless the caller gave ``output_size``, and
records the op with the length static: the lowerings treat ``minlength`` /
``output_size`` as the exact output length.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.histc.default)(jnp.asarray([0., 1., 1., 3.]), 4, 0, 3).tolist()
    [1.0, 2.0, 0.0, 1.0]
"""
from __future__ import annotations

from typing import Any, Sequence

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


def _data_range(x: jax.Array, lo: jax.Array, hi: jax.Array, use_data: Any, widen: float) -> tuple[jax.Array, ...]:
    """``(lo, hi)``, replaced by the data's range where ``use_data``, widened by ``widen`` when empty."""
    if x.size:
        lo = jnp.where(use_data, jnp.min(x), lo)
        hi = jnp.where(use_data, jnp.max(x), hi)
    empty = lo == hi
    return jnp.where(empty, lo - widen, lo), jnp.where(empty, hi + widen, hi)


def _count(flat: jax.Array, pos: jax.Array, lo: jax.Array, hi: jax.Array, bins: int, weights: Any,
           dtype: Any) -> jax.Array:
    pos = jnp.clip(pos, 0, bins - 1)  # the top edge: last bin (negatives are out of range anyway)
    valid = (flat >= lo) & (flat <= hi)
    w = valid.astype(dtype) if weights is None else jnp.where(valid, weights.reshape(-1).astype(dtype), 0)
    return jnp.zeros((bins,), dtype).at[pos].add(w)


@lowering(aten.histc.default)
def _histc(x: jax.Array, bins: int = 100, min: Any = 0, max: Any = 0) -> jax.Array:  # noqa: A002
    dt = torch_dtype(x)
    c = to_jax(dt) if dt.is_floating_point else jnp.float64
    v = (x if dt.is_floating_point else cast(x, torch.float64)).reshape(-1)
    lo, hi = jnp.asarray(min, c), jnp.asarray(max, c)
    lo, hi = _data_range(v, lo, hi, lo == hi, 1)
    pos = jnp.trunc((v - lo) * jnp.asarray(bins, c) / (hi - lo))
    pos = jnp.where(jnp.isfinite(pos), pos, -1).astype(jnp.int64)
    acc = jnp.float32 if dt in (torch.float16, torch.bfloat16) else to_jax(dt)
    return _count(v, pos, lo, hi, bins, None, acc).astype(to_jax(dt))


@lowering(aten.histogram.bin_ct)
def _histogram(x: jax.Array, bins: int = 100, *, range: Sequence[float] | None = None,  # noqa: A002
               weight: jax.Array | None = None, density: bool = False) -> tuple[jax.Array, jax.Array]:
    dt = x.dtype
    v = x.reshape(-1)
    if range is None:
        lo, hi = _data_range(v, jnp.zeros((), dt), jnp.zeros((), dt), v.size > 0, 0.5)
        if not v.size:
            lo, hi = jnp.zeros((), dt), jnp.ones((), dt)
    else:
        lo, hi = _data_range(v, jnp.asarray(range[0], dt), jnp.asarray(range[1], dt), False, 0.5)
    edges = _edges(lo, hi, bins)
    pos = jnp.searchsorted(edges, v, side="right") - 1
    hist = _count(v, pos, lo, hi, bins, weight, dt)
    if density:
        hist = hist / (jnp.sum(hist) * jnp.diff(edges))
    return hist, edges


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


@lowering(aten.repeat_interleave.Tensor)
def _repeat_interleave(repeats: jax.Array, *, output_size: int | None = None) -> jax.Array:
    if output_size is None:
        raise NotImplementedError("repeat_interleave(repeats) without output_size: the length is data-dependent")
    r = repeats.reshape(-1)
    return jnp.repeat(jnp.arange(r.shape[0], dtype=to_jax(torch_dtype(repeats))), r, total_repeat_length=output_size)
