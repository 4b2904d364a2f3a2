"""Temporary lowerings the core needs until the lowering table has them.

Each registers only if the op has no lowering yet, so the real table always wins.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.registry import get_lowering, lowering

aten = torch.ops.aten
TEMP_RANDOM: set[Any] = set()  # random ops registered here while the registry lacks ``random=``


def _jd(dtype: Any) -> Any:
    from xla_dtensor.core.dtypes import to_jax
    return to_jax(dtype if dtype is not None else torch.get_default_dtype())


def _maybe(*ops: Any, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    missing = [op for op in ops if get_lowering(op) is None]

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if not missing:
            return fn
        try:
            return lowering(*missing, **kw)(fn)
        except TypeError:  # registry without random=
            TEMP_RANDOM.update(missing)
            return lowering(*missing)(fn)
    return deco


def _out_dtype(*xs: Any) -> Any:
    from xla_dtensor.core.dtypes import to_jax, to_torch
    ts = []
    for x in xs:
        if hasattr(x, "dtype") and getattr(x, "weak_type", False) is False and hasattr(x, "shape"):
            ts.append(torch.empty((1,) * len(x.shape), dtype=to_torch(x.dtype)) if x.shape else torch.tensor(0, dtype=to_torch(x.dtype)))
        elif hasattr(x, "dtype"):
            ts.append(1.0 if jnp.issubdtype(x.dtype, jnp.floating) else (1 if jnp.issubdtype(x.dtype, jnp.integer) else True))
        else:
            ts.append(x)
    return to_jax(torch.result_type(*ts)) if len(ts) == 2 else None


def _binary(f: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def low(x: Any, y: Any, alpha: Any = 1) -> Any:
        d = _out_dtype(x, y)
        if not (type(alpha) is int and alpha == 1):
            y = y * alpha
        return f(jnp.asarray(x).astype(d), jnp.asarray(y).astype(d))
    return low


_maybe(aten.add.Tensor, aten.add.Scalar, aten.add_.Tensor, aten.add_.Scalar)(_binary(jnp.add))
_maybe(aten.sub.Tensor, aten.sub_.Tensor)(_binary(jnp.subtract))
_maybe(aten.mul.Tensor, aten.mul.Scalar, aten.mul_.Tensor, aten.mul_.Scalar)(_binary(jnp.multiply))


@_maybe(aten.div.Tensor, aten.div_.Tensor)
def _div(x: Any, y: Any) -> Any:
    d = _out_dtype(x, y)
    if not jnp.issubdtype(d, jnp.floating):
        d = _jd(None)
    return jnp.asarray(x).astype(d) / jnp.asarray(y).astype(d)


@_maybe(aten.mm.default)
def _mm(x: Any, y: Any) -> Any:
    return x @ y


@_maybe(aten.view.default, aten._unsafe_view.default)
def _view(x: Any, size: Any) -> Any:
    return x.reshape(tuple(size))


@_maybe(aten.t.default)
def _t(x: Any) -> Any:
    return x.T


@_maybe(aten.transpose.int)
def _transpose(x: Any, d0: int, d1: int) -> Any:
    return jnp.swapaxes(x, d0, d1)


@_maybe(aten.select.int)
def _select(x: Any, dim: int, index: int) -> Any:
    return jnp.take(x, index, axis=dim)


@_maybe(aten.slice.Tensor)
def _slice(x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Any:
    n = x.shape[dim]
    start = 0 if start is None else (start + n if start < 0 else start)
    end = n if end is None else (end + n if end < 0 else end)
    start, end = max(0, min(start, n)), max(0, min(end, n))
    idx = [slice(None)] * x.ndim
    idx[dim] = slice(start, max(start, end), step)
    return x[tuple(idx)]


@_maybe(aten.expand.default)
def _expand(x: Any, size: Any, implicit: bool = False) -> Any:
    size = tuple(x.shape[i - (len(size) - x.ndim)] if s == -1 else s for i, s in enumerate(size))
    return jnp.broadcast_to(x, size)


@_maybe(aten.sum.default)
def _sum(x: Any, dtype: Any = None) -> Any:
    d = _jd(dtype) if dtype is not None else (jnp.int64 if jnp.issubdtype(x.dtype, jnp.integer) or x.dtype == jnp.bool_ else x.dtype)
    return jnp.sum(x, dtype=d)


@_maybe(aten.zero_.default)
def _zero(x: Any) -> Any:
    return jnp.zeros_like(x)


@_maybe(aten.fill_.Scalar)
def _fill(x: Any, v: Any) -> Any:
    return jnp.full(x.shape, v, x.dtype)


@_maybe(aten.empty.memory_format)
def _empty(size: Any, dtype: Any = None, layout: Any = None, device: Any = None, pin_memory: Any = None,
           memory_format: Any = None) -> Any:
    return jnp.zeros(tuple(size), _jd(dtype))


@_maybe(aten.empty_strided.default)
def _empty_strided(size: Any, stride: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                   pin_memory: Any = None) -> Any:
    return jnp.zeros(tuple(size), _jd(dtype))


@_maybe(aten.normal_.default, random=True)
def _normal(key: Any, x: Any, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Any:
    return (jax.random.normal(key, x.shape, jnp.float32) * std + mean).astype(x.dtype)


@_maybe(aten.uniform_.default, random=True)
def _uniform(key: Any, x: Any, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Any:
    return jax.random.uniform(key, x.shape, jnp.float32, a, b).astype(x.dtype)


@_maybe(aten.clone.default)
def _clone(x: Any, memory_format: Any = None) -> Any:
    return x


@_maybe(aten.full_like.default)
def _full_like(x: Any, fill_value: Any, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None, memory_format: Any = None) -> Any:
    return jnp.full(x.shape, fill_value, _jd(dtype) if dtype is not None else x.dtype)


@_maybe(aten.ones_like.default)
def _ones_like(x: Any, dtype: Any = None, layout: Any = None, device: Any = None,
               pin_memory: Any = None, memory_format: Any = None) -> Any:
    return jnp.ones(x.shape, _jd(dtype) if dtype is not None else x.dtype)


@_maybe(aten.zeros_like.default, aten.empty_like.default)
def _zeros_like(x: Any, dtype: Any = None, layout: Any = None, device: Any = None,
                pin_memory: Any = None, memory_format: Any = None) -> Any:
    return jnp.zeros(x.shape, _jd(dtype) if dtype is not None else x.dtype)
