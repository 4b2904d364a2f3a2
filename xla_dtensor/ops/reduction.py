"""Reduction lowerings: sum, mean, prod, amax/amin, max/min, argmax/argmin, var/std, any/all, norms.

Output dtypes follow torch: integer and bool sums/products give int64, ``mean`` of
an integer tensor without ``dtype=`` is an error, half types accumulate in float32.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.sum.default)(jnp.ones(3, jnp.bool_)).dtype
    dtype('int64')
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
Dims = int | Sequence[int] | None


def axes(x: jax.Array, dim: Dims) -> tuple[int, ...]:
    """Reduction axes of ``x`` for torch's ``dim`` argument (``None`` or ``[]`` mean all).

    Example:
        >>> axes(jnp.zeros((2, 3)), -1)
        (1,)
    """
    if dim is None or (not isinstance(dim, int) and len(dim) == 0):
        return tuple(range(x.ndim))
    dims = [dim] if isinstance(dim, int) else dim
    return tuple(sorted({wrap_dim(d, x.ndim) for d in dims})) if x.ndim else ()


def _sum_dtype(x: jax.Array, dtype: torch.dtype | None) -> torch.dtype:
    if dtype is not None:
        return dtype
    dt = torch_dtype(x)
    return torch.int64 if (dt == torch.bool or not (dt.is_floating_point or dt.is_complex)) else dt


@lowering(aten.sum.default, aten.sum.dim_IntList)
def _sum(x: jax.Array, dim: Dims = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = _sum_dtype(x, dtype)
    return jnp.sum(cast(x, compute_type(out)), axis=axes(x, dim), keepdims=keepdim).astype(to_jax(out))


@lowering(aten.nansum.default)
def _nansum(x: jax.Array, dim: Dims = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = _sum_dtype(x, dtype)
    return jnp.nansum(cast(x, compute_type(out)), axis=axes(x, dim), keepdims=keepdim).astype(to_jax(out))


@lowering(aten.prod.default, aten.prod.dim_int)
def _prod(x: jax.Array, dim: Dims = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = _sum_dtype(x, dtype)
    return jnp.prod(cast(x, compute_type(out)), axis=axes(x, dim), keepdims=keepdim).astype(to_jax(out))


@lowering(aten.mean.default, aten.mean.dim)
def _mean(x: jax.Array, dim: Dims = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> jax.Array:
    out = dtype or torch_dtype(x)
    if not (out.is_floating_point or out.is_complex):
        raise TypeError(f"mean: input dtype {torch_dtype(x)} is not floating or complex; pass dtype=")
    return jnp.mean(cast(x, compute_type(out)), axis=axes(x, dim), keepdims=keepdim).astype(to_jax(out))


def _check_nonempty(x: jax.Array, ax: tuple[int, ...], name: str) -> None:
    if any(x.shape[a] == 0 for a in ax) or (x.size == 0 and not ax):
        raise ValueError(f"{name}: cannot reduce over an empty dimension (shape {x.shape}, dims {ax})")


def _max_like(x: jax.Array, ax: tuple[int, ...], keepdim: bool, is_max: bool) -> jax.Array:
    if x.dtype == jnp.bool_:
        return (jnp.any if is_max else jnp.all)(x, axis=ax, keepdims=keepdim)
    fn = jnp.max if is_max else jnp.min
    return fn(x, axis=ax, keepdims=keepdim)  # NaN propagates, as in torch


@lowering(aten.amax.default)
def _amax(x: jax.Array, dim: Dims = (), keepdim: bool = False) -> jax.Array:
    ax = axes(x, dim)
    _check_nonempty(x, ax, "amax")
    return _max_like(x, ax, keepdim, True)


@lowering(aten.amin.default)
def _amin(x: jax.Array, dim: Dims = (), keepdim: bool = False) -> jax.Array:
    ax = axes(x, dim)
    _check_nonempty(x, ax, "amin")
    return _max_like(x, ax, keepdim, False)


@lowering(aten.max.default)
def _max_all(x: jax.Array) -> jax.Array:
    return _amax(x)


@lowering(aten.min.default)
def _min_all(x: jax.Array) -> jax.Array:
    return _amin(x)


def _arg(x: jax.Array, dim: int | None, keepdim: bool, is_max: bool) -> jax.Array:
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.int8)
    fn = jnp.argmax if is_max else jnp.argmin
    if dim is None:
        _check_nonempty(x, tuple(range(x.ndim)), "argmax" if is_max else "argmin")
        idx = fn(x.reshape(-1))
        return idx.reshape((1,) * x.ndim).astype(jnp.int64) if keepdim else idx.astype(jnp.int64)
    if x.ndim == 0:
        return jnp.zeros((), jnp.int64)
    d = wrap_dim(dim, x.ndim)
    _check_nonempty(x, (d,), "argmax" if is_max else "argmin")
    return fn(x, axis=d, keepdims=keepdim).astype(jnp.int64)


@lowering(aten.argmax.default)
def _argmax(x: jax.Array, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    return _arg(x, dim, keepdim, True)


@lowering(aten.argmin.default)
def _argmin(x: jax.Array, dim: int | None = None, keepdim: bool = False) -> jax.Array:
    return _arg(x, dim, keepdim, False)


@lowering(aten.max.dim)
def _max_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    ax = axes(x, dim)
    _check_nonempty(x, ax, "max")
    return _max_like(x, ax, keepdim, True), _arg(x, dim, keepdim, True)


@lowering(aten.min.dim)
def _min_dim(x: jax.Array, dim: int, keepdim: bool = False) -> tuple[jax.Array, jax.Array]:
    ax = axes(x, dim)
    _check_nonempty(x, ax, "min")
    return _max_like(x, ax, keepdim, False), _arg(x, dim, keepdim, False)


def _var(x: jax.Array, dim: Dims, correction: float | None, keepdim: bool) -> tuple[jax.Array, jax.Array]:
    dt = torch_dtype(x)
    if not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"var/std: input dtype {dt} is not floating or complex")
    ax = axes(x, dim)
    y = cast(x, compute_type(dt))
    n = 1
    for a in ax:
        n *= x.shape[a]
    mean = jnp.mean(y, axis=ax, keepdims=True)
    dev = jnp.abs(y - mean) ** 2
    denom = max(n - (1 if correction is None else correction), 0)
    var = jnp.sum(dev, axis=ax, keepdims=keepdim) / denom
    out = to_jax(dt) if not dt.is_complex else jnp.real(y).dtype
    return var.astype(out), (mean if keepdim else jnp.squeeze(mean, ax)).astype(to_jax(dt))


def _var_args(args: tuple, kwargs: dict) -> tuple[Dims, float | None, bool]:
    """Normalize var/std's three overload signatures to (dim, correction, keepdim)."""
    dim = args[0] if args else kwargs.get("dim")
    if isinstance(dim, bool):  # var.default(x, unbiased)
        return None, (1 if dim else 0), False
    if len(args) > 1 and isinstance(args[1], bool):  # var.dim(x, dim, unbiased, keepdim)
        return dim, (1 if args[1] else 0), (args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    if "unbiased" in kwargs:
        return dim, (1 if kwargs["unbiased"] else 0), kwargs.get("keepdim", False)
    return dim, kwargs.get("correction"), kwargs.get("keepdim", args[1] if len(args) > 1 else False)


@lowering(aten.var.default, aten.var.dim, aten.var.correction)
def _var_op(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
    return _var(x, *_var_args(args, kwargs))[0]


@lowering(aten.std.default, aten.std.dim, aten.std.correction)
def _std_op(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
    return jnp.sqrt(_var(x, *_var_args(args, kwargs))[0])


@lowering(aten.var_mean.default, aten.var_mean.dim, aten.var_mean.correction)
def _var_mean(x: jax.Array, *args: Any, **kwargs: Any) -> tuple[jax.Array, jax.Array]:
    return _var(x, *_var_args(args, kwargs))


@lowering(aten.std_mean.default, aten.std_mean.dim, aten.std_mean.correction)
def _std_mean(x: jax.Array, *args: Any, **kwargs: Any) -> tuple[jax.Array, jax.Array]:
    var, mean = _var(x, *_var_args(args, kwargs))
    return jnp.sqrt(var), mean


def _logical(x: jax.Array, dim: Dims, keepdim: bool, fn: Any) -> jax.Array:
    out = fn(x != 0 if x.dtype != jnp.bool_ else x, axis=axes(x, dim), keepdims=keepdim)
    return out.astype(jnp.uint8) if x.dtype == jnp.uint8 else out


@lowering(aten.any.default, aten.any.dim, aten.any.dims)
def _any(x: jax.Array, dim: Dims = None, keepdim: bool = False) -> jax.Array:
    return _logical(x, dim, keepdim, jnp.any)


@lowering(aten.all.default, aten.all.dim, aten.all.dims)
def _all(x: jax.Array, dim: Dims = None, keepdim: bool = False) -> jax.Array:
    return _logical(x, dim, keepdim, jnp.all)


@lowering(aten.count_nonzero.default, aten.count_nonzero.dim_IntList)
def _count_nonzero(x: jax.Array, dim: Dims = None) -> jax.Array:
    return jnp.sum(x != 0, axis=axes(x, dim)).astype(jnp.int64)


def vector_norm(x: jax.Array, ord: Any, ax: tuple[int, ...], keepdim: bool, dtype: torch.dtype | None) -> jax.Array:
    """p-norm of ``x`` over ``ax`` (``ord`` in {inf, -inf, 0, p}), in torch's output dtype."""
    dt = dtype or torch_dtype(x)
    if not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"linalg.vector_norm: expected a floating point or complex tensor, got {dt}")
    out = to_jax(dt) if not dt.is_complex else to_jax(dt.to_real())
    a = jnp.abs(cast(x, compute_type(dt)))
    ord = float(ord)
    if ord == float("inf"):
        r = jnp.max(a, axis=ax, keepdims=keepdim) if a.size else jnp.zeros(_kept(a, ax, keepdim), a.dtype)
    elif ord == float("-inf"):
        r = jnp.min(a, axis=ax, keepdims=keepdim)
    elif ord == 0:
        r = jnp.sum((a != 0).astype(a.dtype), axis=ax, keepdims=keepdim)
    elif ord == 1:
        r = jnp.sum(a, axis=ax, keepdims=keepdim)
    elif ord == 2:
        r = jnp.sqrt(jnp.sum(a * a, axis=ax, keepdims=keepdim))
    else:
        r = jnp.sum(a ** ord, axis=ax, keepdims=keepdim) ** (1.0 / ord)
    return r.astype(out)


def _kept(a: jax.Array, ax: tuple[int, ...], keepdim: bool) -> tuple[int, ...]:
    return tuple(1 if i in ax else n for i, n in enumerate(a.shape) if keepdim or i not in ax)


@lowering(aten.linalg_vector_norm.default)
def _linalg_vector_norm(x: jax.Array, ord: Any = 2, dim: Dims = None, keepdim: bool = False, *,
                        dtype: torch.dtype | None = None) -> jax.Array:
    return vector_norm(x, ord, axes(x, dim), keepdim, dtype)


@lowering(aten.norm.Scalar, aten.norm.ScalarOpt_dim, aten.norm.ScalarOpt_dtype, aten.norm.ScalarOpt_dim_dtype)
def _norm(x: jax.Array, p: Any = 2, dim: Dims = None, keepdim: bool = False, *,
          dtype: torch.dtype | None = None) -> jax.Array:
    if isinstance(dim, torch.dtype):  # norm.ScalarOpt_dtype(x, p, *, dtype) positional quirk
        dim, dtype = None, dim
    return vector_norm(x, 2 if p is None else p, axes(x, dim), keepdim, dtype)


@lowering(aten.logsumexp.default)
def _logsumexp(x: jax.Array, dim: Dims, keepdim: bool = False) -> jax.Array:
    dt = torch_dtype(x)
    out = dt if (dt.is_floating_point or dt.is_complex) else torch.get_default_dtype()
    y = cast(x, compute_type(out))
    ax = axes(x, dim)
    if x.size == 0:
        return jnp.full(_kept(x, ax, keepdim), -jnp.inf, to_jax(out))
    m = jax.lax.stop_gradient(jnp.max(y, axis=ax, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0)
    r = jnp.log(jnp.sum(jnp.exp(y - m), axis=ax, keepdims=True)) + m
    return (r if keepdim else jnp.squeeze(r, ax)).astype(to_jax(out))
