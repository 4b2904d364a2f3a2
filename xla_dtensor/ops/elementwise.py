"""Unary elementwise lowerings: math functions, rounding, predicates.

Floating functions follow torch's int-to-float rule (``sin(int64) -> float32``) and
compute half types in float32 ("opmath") before rounding back, as torch CPU does.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.sqrt.default)(jnp.arange(3)).dtype
    dtype('float32')
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import jax.scipy.special as jsp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, float_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _float_unary(fn: Callable[[jax.Array], jax.Array]) -> Callable[..., jax.Array]:
    def lower(x: jax.Array) -> jax.Array:
        out = float_type(torch_dtype(x))
        return fn(cast(x, compute_type(out))).astype(to_jax(out))
    return lower


def _rsqrt(x: jax.Array) -> jax.Array:
    return jax.lax.rsqrt(x)


def _reciprocal(x: jax.Array) -> jax.Array:
    return 1 / x


def _sigmoid(x: jax.Array) -> jax.Array:
    return jax.nn.sigmoid(x)


def _sinc(x: jax.Array) -> jax.Array:
    return jnp.sinc(x)


_FLOAT_UNARY: dict[Any, Callable[[jax.Array], jax.Array]] = {
    aten.exp.default: jnp.exp, aten.exp2.default: jnp.exp2, aten.expm1.default: jnp.expm1,
    aten.log.default: jnp.log, aten.log2.default: jnp.log2, aten.log10.default: jnp.log10,
    aten.log1p.default: jnp.log1p, aten.sin.default: jnp.sin, aten.cos.default: jnp.cos,
    aten.tan.default: jnp.tan, aten.asin.default: jnp.arcsin, aten.acos.default: jnp.arccos,
    aten.atan.default: jnp.arctan, aten.sinh.default: jnp.sinh, aten.cosh.default: jnp.cosh,
    aten.tanh.default: jnp.tanh, aten.asinh.default: jnp.arcsinh, aten.acosh.default: jnp.arccosh,
    aten.atanh.default: jnp.arctanh, aten.sqrt.default: jnp.sqrt, aten.rsqrt.default: _rsqrt,
    aten.sigmoid.default: _sigmoid, aten.erf.default: jsp.erf, aten.erfc.default: jsp.erfc,
    aten.erfinv.default: jsp.erfinv, aten.reciprocal.default: _reciprocal,
    aten.lgamma.default: jsp.gammaln, aten.digamma.default: jsp.digamma, aten.i0.default: jsp.i0,
    aten.sinc.default: _sinc, aten.special_i0e.default: jsp.i0e, aten.special_i1.default: jsp.i1,
    aten.special_i1e.default: jsp.i1e, aten.special_ndtri.default: jsp.ndtri,
    aten.special_erfcx.default: jsp.erfcx if hasattr(jsp, "erfcx") else (lambda x: jnp.exp(x * x) * jsp.erfc(x)),
}
for _op, _fn in _FLOAT_UNARY.items():
    lowering(_op)(_float_unary(_fn))


@lowering(aten.neg.default)
def _neg(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        raise TypeError("neg: negation of a bool tensor is not supported (torch raises too); use logical_not")
    return jnp.negative(x)


@lowering(aten.abs.default)
def _abs(x: jax.Array) -> jax.Array:
    return x if x.dtype == jnp.bool_ else jnp.abs(x)


@lowering(aten.sign.default, aten.sgn.default)
def _sign(x: jax.Array) -> jax.Array:
    return x if x.dtype == jnp.bool_ else jnp.sign(x)


@lowering(aten.positive.default)
def _positive(x: jax.Array) -> jax.Array:
    return x


def _rounding(fn: Callable[[jax.Array], jax.Array]) -> Callable[[jax.Array], jax.Array]:
    def lower(x: jax.Array) -> jax.Array:
        if not jnp.issubdtype(x.dtype, jnp.floating):
            return x
        return fn(x)
    return lower


lowering(aten.floor.default)(_rounding(jnp.floor))
lowering(aten.ceil.default)(_rounding(jnp.ceil))
lowering(aten.trunc.default, aten.fix.default)(_rounding(jnp.trunc))
lowering(aten.frac.default)(_rounding(lambda x: x - jnp.trunc(x)))


@lowering(aten.round.default, aten.round.decimals)
def _round(x: jax.Array, *, decimals: int = 0) -> jax.Array:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    if decimals == 0:
        return jnp.round(x)
    scale = 10.0 ** decimals
    y = cast(x, compute_type(torch_dtype(x)))
    return (jnp.round(y * scale) / scale).astype(x.dtype)


@lowering(aten.bitwise_not.default)
def _bitwise_not(x: jax.Array) -> jax.Array:
    return jnp.logical_not(x) if x.dtype == jnp.bool_ else jnp.bitwise_not(x)


@lowering(aten.logical_not.default)
def _logical_not(x: jax.Array) -> jax.Array:
    return jnp.logical_not(x)


def _float_test(fn: Callable[[jax.Array], jax.Array], kinds: Any = jnp.inexact,
                otherwise: bool = False) -> Callable[[jax.Array], jax.Array]:
    """A float predicate (``isnan``...): ``fn`` on ``kinds`` dtypes, constant ``otherwise`` on the rest."""
    def lower(x: jax.Array) -> jax.Array:
        return fn(x) if jnp.issubdtype(x.dtype, kinds) else jnp.full(x.shape, otherwise, jnp.bool_)
    lower.__name__ = f"_{fn.__name__}"
    return lower


lowering(aten.isnan.default)(_float_test(jnp.isnan))
lowering(aten.isinf.default)(_float_test(jnp.isinf))
lowering(aten.isfinite.default)(_float_test(jnp.isfinite, otherwise=True))
lowering(aten.isposinf.default)(_float_test(jnp.isposinf, jnp.floating))
lowering(aten.isneginf.default)(_float_test(jnp.isneginf, jnp.floating))


@lowering(aten.signbit.default)
def _signbit(x: jax.Array) -> jax.Array:
    return jnp.signbit(x) if x.dtype != jnp.bool_ else jnp.zeros(x.shape, jnp.bool_)


@lowering(aten.nan_to_num.default)
def _nan_to_num(x: jax.Array, nan: float | None = None, posinf: float | None = None,
                neginf: float | None = None) -> jax.Array:
    if not jnp.issubdtype(x.dtype, jnp.floating):
        return x
    info = jnp.finfo(x.dtype)
    x = jnp.where(jnp.isnan(x), jnp.asarray(0.0 if nan is None else nan, x.dtype), x)
    x = jnp.where(jnp.isposinf(x), jnp.asarray(info.max if posinf is None else posinf, x.dtype), x)
    return jnp.where(jnp.isneginf(x), jnp.asarray(info.min if neginf is None else neginf, x.dtype), x)


@lowering(aten.logit.default)
def _logit(x: jax.Array, eps: float | None = None) -> jax.Array:
    out = float_type(torch_dtype(x))
    y = cast(x, compute_type(out))
    if eps is not None:
        y = jnp.clip(y, eps, 1 - eps)
    return jnp.log(y / (1 - y)).astype(to_jax(out))


@lowering(aten.angle.default)
def _angle(x: jax.Array) -> jax.Array:
    out = float_type(torch_dtype(x))
    return jnp.where(jnp.isnan(x), x, jnp.where(x < 0, jnp.pi, 0.0)).astype(to_jax(out)) \
        if not jnp.iscomplexobj(x) else jnp.angle(x)


@lowering(aten.real.default)
def _real(x: jax.Array) -> jax.Array:
    return jnp.real(x)
