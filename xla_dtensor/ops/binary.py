"""Binary and ternary elementwise lowerings: arithmetic, comparisons, where, clamp, lerp.

Inputs are promoted with torch's rules (``dtypes.result_type``) and computed in the
result dtype, so ``int64 + 2.5 -> float32``, ``int / int -> float32`` and
comparisons return ``bool``.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.div.Tensor)(jnp.arange(3), 2).tolist()
    [0.0, 0.5, 1.0]
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, float_type, result_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten
Value = Any


def _promoted(*args: Value) -> tuple[torch.dtype, list[jax.Array]]:
    dt = result_type(*args)
    return dt, [cast(a, dt) for a in args]


def _check_alpha(dt: torch.dtype, alpha: Value) -> None:
    if isinstance(alpha, float) and not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"alpha={alpha!r} is a float but the result dtype is {dt}; torch requires an integral alpha")


@lowering(aten.add.Tensor, aten.add.Scalar)
def _add(a: Value, b: Value, *, alpha: Value = 1) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    _check_alpha(dt, alpha)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * cast(alpha, dt)
    if dt == torch.bool:
        return jnp.logical_or(x, y)
    return x + y


@lowering(aten.sub.Tensor, aten.sub.Scalar)
def _sub(a: Value, b: Value, *, alpha: Value = 1) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    if dt == torch.bool:
        raise TypeError("sub: subtracting bool tensors is not supported (torch raises too); use logical_xor")
    _check_alpha(dt, alpha)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        y = y * cast(alpha, dt)
    return x - y


@lowering(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(a: Value, b: Value, *, alpha: Value = 1) -> jax.Array:
    return _sub(b, a, alpha=alpha) if not isinstance(alpha, (int, float)) or alpha != 1 else _sub(b, a)


@lowering(aten.mul.Tensor, aten.mul.Scalar)
def _mul(a: Value, b: Value) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    return jnp.logical_and(x, y) if dt == torch.bool else x * y


@lowering(aten.div.Tensor, aten.div.Scalar, aten.true_divide.Tensor, aten.true_divide.Scalar)
def _div(a: Value, b: Value) -> jax.Array:
    dt = float_type(result_type(a, b))
    x, y = cast(a, compute_type(dt)), cast(b, compute_type(dt))
    return (x / y).astype(to_jax(dt))


@lowering(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(a: Value, b: Value, *, rounding_mode: str | None = None) -> jax.Array:
    if rounding_mode is None:
        return _div(a, b)
    if rounding_mode not in ("trunc", "floor"):
        raise ValueError(f"div: rounding_mode={rounding_mode!r}; allowed: None, 'trunc', 'floor'")
    dt, (x, y) = _promoted(a, b)
    if dt.is_floating_point:
        q = cast(x, compute_type(dt)) / cast(y, compute_type(dt))
        return (jnp.trunc(q) if rounding_mode == "trunc" else jnp.floor(q)).astype(to_jax(dt))
    if rounding_mode == "floor":
        return jnp.floor_divide(x, y)
    q = jnp.floor_divide(x, y)
    return jnp.where((q < 0) & (q * y != x), q + 1, q)


@lowering(aten.floor_divide.default, aten.floor_divide.Scalar)
def _floor_divide(a: Value, b: Value) -> jax.Array:
    return _div_mode(a, b, rounding_mode="floor")


@lowering(aten.remainder.Tensor, aten.remainder.Scalar, aten.remainder.Scalar_Tensor)
def _remainder(a: Value, b: Value) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    return jnp.remainder(x, y)


@lowering(aten.fmod.Tensor, aten.fmod.Scalar)
def _fmod(a: Value, b: Value) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    return jnp.fmod(x, y)


@lowering(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(a: Value, b: Value) -> jax.Array:
    dt = result_type(a, b)
    if isinstance(b, int) and not isinstance(b, bool) and not isinstance(a, (int, float)):
        return jax.lax.integer_pow(cast(a, dt), b) if b >= 0 or dt.is_floating_point else \
            jnp.power(cast(a, dt), cast(b, dt))
    x, y = cast(a, compute_type(dt)), cast(b, compute_type(dt))
    return jnp.power(x, y).astype(to_jax(dt))


def _binary_same(name: str, fn: Callable[[jax.Array, jax.Array], jax.Array], *ops: Any) -> None:
    def lower(a: Value, b: Value) -> jax.Array:
        dt, (x, y) = _promoted(a, b)
        return fn(x, y)
    lower.__name__ = f"_{name}"
    lowering(*ops)(lower)


def _binary_float(name: str, fn: Callable[[jax.Array, jax.Array], jax.Array], *ops: Any) -> None:
    def lower(a: Value, b: Value) -> jax.Array:
        dt = float_type(result_type(a, b))
        return fn(cast(a, compute_type(dt)), cast(b, compute_type(dt))).astype(to_jax(dt))
    lower.__name__ = f"_{name}"
    lowering(*ops)(lower)


def _bool_binary(name: str, fn: Callable[[jax.Array, jax.Array], jax.Array], *ops: Any) -> None:
    def lower(a: Value, b: Value) -> jax.Array:
        dt, (x, y) = _promoted(a, b)
        return fn(x, y)
    lower.__name__ = f"_{name}"
    lowering(*ops)(lower)


def _max(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.logical_or(x, y) if x.dtype == jnp.bool_ else jnp.maximum(x, y)


def _min(x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.logical_and(x, y) if x.dtype == jnp.bool_ else jnp.minimum(x, y)


_binary_same("maximum", _max, aten.maximum.default, aten.max.other)
_binary_same("minimum", _min, aten.minimum.default, aten.min.other)
_binary_same("fmax", jnp.fmax, aten.fmax.default)
_binary_same("fmin", jnp.fmin, aten.fmin.default)
_binary_same("bitwise_and", jnp.bitwise_and, aten.bitwise_and.Tensor, aten.bitwise_and.Scalar)
_binary_same("bitwise_or", jnp.bitwise_or, aten.bitwise_or.Tensor, aten.bitwise_or.Scalar)
_binary_same("bitwise_xor", jnp.bitwise_xor, aten.bitwise_xor.Tensor, aten.bitwise_xor.Scalar)
_binary_same("lshift", jnp.left_shift, aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar)
_binary_same("rshift", jnp.right_shift, aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar)
_binary_float("atan2", jnp.arctan2, aten.atan2.default)
_binary_float("hypot", jnp.hypot, aten.hypot.default)
_binary_float("copysign", jnp.copysign, aten.copysign.Tensor, aten.copysign.Scalar)
_binary_float("logaddexp", jnp.logaddexp, aten.logaddexp.default)
_binary_float("logaddexp2", jnp.logaddexp2, aten.logaddexp2.default)
_binary_float("xlogy", lambda x, y: jnp.where(x == 0, jnp.where(jnp.isnan(y), y, 0), x * jnp.log(y)),
              aten.xlogy.Tensor, aten.xlogy.Scalar_Other, aten.xlogy.Scalar_Self)
_binary_same("nextafter", jnp.nextafter, aten.nextafter.default)
_binary_same("heaviside", lambda x, y: jnp.where(x == 0, y, (x > 0).astype(x.dtype)), aten.heaviside.default)
for _name, _fn in [("eq", jnp.equal), ("ne", jnp.not_equal), ("lt", jnp.less), ("le", jnp.less_equal),
                   ("gt", jnp.greater), ("ge", jnp.greater_equal)]:
    _bool_binary(_name, _fn, getattr(aten, _name).Tensor, getattr(aten, _name).Scalar)
_bool_binary("logical_and", jnp.logical_and, aten.logical_and.default)
_bool_binary("logical_or", jnp.logical_or, aten.logical_or.default)
_bool_binary("logical_xor", jnp.logical_xor, aten.logical_xor.default)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(cond: jax.Array, a: Value, b: Value) -> jax.Array:
    dt, (x, y) = _promoted(a, b)
    return jnp.where(cond, x, y)


@lowering(aten.clamp.default, aten.clamp.Tensor)
def _clamp(x: jax.Array, min: Value = None, max: Value = None) -> jax.Array:  # noqa: A002
    if min is None and max is None:
        raise ValueError("clamp: at least one of min and max must be given (both are None)")
    dt = result_type(x, min, max)
    y = cast(x, dt)
    for bound, take in ((min, jnp.less), (max, jnp.greater)):
        if bound is None:
            continue
        b = cast(bound, dt)
        if dt.is_floating_point:  # NaN in x or in the bound propagates, as in torch
            y = jnp.where(take(y, b) | jnp.isnan(b), b, y)
        else:
            y = _max(y, b) if take is jnp.less else _min(y, b)
    return y


@lowering(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(x: jax.Array, min: Value) -> jax.Array:  # noqa: A002
    return _clamp(x, min, None)


@lowering(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(x: jax.Array, max: Value) -> jax.Array:  # noqa: A002
    return _clamp(x, None, max)


@lowering(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(x: jax.Array, mask: jax.Array, value: Value) -> jax.Array:
    return jnp.where(mask, cast(value, torch_dtype(x)), x)


@lowering(aten.lerp.Scalar, aten.lerp.Tensor)
def _lerp(start: jax.Array, end: jax.Array, weight: Value) -> jax.Array:
    dt = result_type(start, end)
    c = compute_type(dt)
    s, e, w = cast(start, c), cast(end, c), cast(weight, c)
    diff = e - s
    out = jnp.where(jnp.abs(w) < 0.5, s + w * diff, e - diff * (1 - w))
    return out.astype(to_jax(result_type(start, end, weight) if not isinstance(weight, (int, float)) else dt))


@lowering(aten.addcmul.default)
def _addcmul(x: jax.Array, t1: jax.Array, t2: jax.Array, *, value: Value = 1) -> jax.Array:
    dt, (a, b, c) = _promoted(x, t1, t2)
    return a + cast(value, dt) * b * c


@lowering(aten.addcdiv.default)
def _addcdiv(x: jax.Array, t1: jax.Array, t2: jax.Array, *, value: Value = 1) -> jax.Array:
    dt, (a, b, c) = _promoted(x, t1, t2)
    if not (dt.is_floating_point or dt.is_complex):
        raise TypeError(f"addcdiv: integer division with addcdiv is not supported (dtype {dt})")
    return a + cast(value, dt) * (b / c)
