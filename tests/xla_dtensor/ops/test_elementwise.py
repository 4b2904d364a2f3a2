"""Elementwise lowerings (unary, binary, activations) against torch CPU eager."""
from __future__ import annotations

import pytest
import torch

from tests.xla_dtensor.ops.harness import T, check

aten = torch.ops.aten
f32, bf16, f16, f64, i64, i32, b = torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64, torch.int32, torch.bool

FLOAT_UNARY = ["exp", "expm1", "log1p", "sin", "cos", "tan", "atan", "sinh", "cosh", "tanh", "asinh", "sigmoid",
               "erf", "erfc", "exp2", "sinc", "reciprocal"]
POS_UNARY = ["log", "log2", "log10", "sqrt", "rsqrt", "lgamma", "digamma", "acosh"]
SAME_UNARY = ["neg", "abs", "sign", "sgn", "floor", "ceil", "trunc", "frac", "round", "positive", "relu"]


@pytest.mark.parametrize("name", FLOAT_UNARY)
@pytest.mark.parametrize("dtype", [f32, bf16, i64])
def test_float_unary(name: str, dtype: torch.dtype) -> None:
    op = getattr(aten, name).default
    check(op, T(3, 4, dtype=dtype, low=-1, high=1) if dtype.is_floating_point else T(3, 4, dtype=dtype, low=-3, high=3))
    check(op, T(dtype=dtype, low=-1, high=1))  # 0-d
    check(op, T(0, 3, dtype=dtype))  # empty


@pytest.mark.parametrize("name", POS_UNARY)
@pytest.mark.parametrize("dtype", [f32, bf16, i64])
def test_positive_domain_unary(name: str, dtype: torch.dtype) -> None:
    check(getattr(aten, name).default, T(2, 5, dtype=dtype, low=1.5, high=4))


def test_asin_acos_atanh_erfinv() -> None:
    for name in ["asin", "acos", "atanh", "erfinv"]:
        check(getattr(aten, name).default, T(4, 3, low=-0.9, high=0.9))


@pytest.mark.parametrize("name", SAME_UNARY)
@pytest.mark.parametrize("dtype", [f32, bf16, i64])
def test_same_dtype_unary(name: str, dtype: torch.dtype) -> None:
    if name == "frac" and not dtype.is_floating_point:
        pytest.skip("torch has no integer frac")
    check(getattr(aten, name).default, T(3, 5, dtype=dtype, low=-5, high=5))


def test_round_decimals_and_half_even() -> None:
    check(aten.round.default, torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5]))
    check(aten.round.decimals, T(4, low=-10, high=10), decimals=2)


def test_predicates_and_bitwise() -> None:
    x = torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), -0.0, 3.0])
    for name in ["isnan", "isinf", "isfinite", "isposinf", "isneginf", "signbit", "logical_not"]:
        check(getattr(aten, name).default, x)
    for name in ["isnan", "isinf", "isfinite", "isposinf", "isneginf"]:  # integers: a constant answer
        check(getattr(aten, name).default, T(3, dtype=i64))
    check(aten.bitwise_not.default, T(3, 2, dtype=i64))
    check(aten.bitwise_not.default, T(3, 2, dtype=b))
    check(aten.nan_to_num.default, x)
    check(aten.nan_to_num.default, x, 0.5, 10.0, -10.0)
    check(aten.logit.default, T(5, low=0.05, high=0.95))
    check(aten.logit.default, T(5, low=0.0, high=1.0), 0.1)


BINARY = ["add", "sub", "mul", "div"]
PAIRS = [(f32, f32), (bf16, bf16), (i64, i64), (i64, f32), (b, i64), (i32, i64), (bf16, f32), (f16, f64)]


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("dtypes", PAIRS, ids=lambda d: f"{d[0]}-{d[1]}".replace("torch.", ""))
def test_binary_promotion_and_broadcast(name: str, dtypes: tuple[torch.dtype, torch.dtype]) -> None:
    op = getattr(aten, name).Tensor
    da, db = dtypes
    if name == "sub" and da == b:
        pytest.skip("torch rejects bool subtraction")
    high = 5 if not da.is_floating_point else 2
    check(op, T(3, 4, dtype=da, low=1, high=high), T(4, dtype=db, low=1, high=4))  # broadcast
    check(op, T(2, 1, 3, dtype=da, low=1, high=high), T(4, 1, dtype=db, low=1, high=4))
    check(op, T(3, 4, dtype=da, low=1, high=high), T(dtype=db, low=1, high=4))  # 0-d tensor other
    check(op, T(0, 4, dtype=da, low=1, high=high), T(4, dtype=db, low=1, high=4))  # empty


@pytest.mark.parametrize("scalar", [2, 2.5, True])
@pytest.mark.parametrize("dtype", [f32, bf16, i64, b])
def test_scalar_overloads(scalar: object, dtype: torch.dtype) -> None:
    x = T(2, 3, dtype=dtype, low=1, high=4)
    check(aten.add.Tensor, x, scalar)
    check(aten.mul.Tensor, x, scalar)
    check(aten.mul.Scalar, x, scalar)
    check(aten.div.Tensor, x, scalar)
    check(aten.eq.Scalar, x, scalar)
    check(aten.lt.Scalar, x, scalar)
    if dtype != b:
        check(aten.add.Scalar, x, scalar)
    if dtype != b and not isinstance(scalar, bool):
        check(aten.sub.Tensor, x, scalar)
        check(aten.rsub.Scalar, x, scalar)
        check(aten.pow.Tensor_Scalar, x, scalar if scalar is not True else 2)


def test_alpha_and_weak_scalars() -> None:
    import jax.numpy as jnp
    from xla_dtensor.ops import get_lowering
    check(aten.add.Tensor, T(3, 2), T(3, 2), alpha=0.5)
    check(aten.sub.Tensor, T(3, 2, dtype=i64), T(2, dtype=i64), alpha=3)
    # a weakly typed 0-d array (what jit makes of a Python scalar) promotes like a Python scalar
    out = get_lowering(aten.add.Tensor)(jnp.ones(3, jnp.int64), jnp.asarray(2.5))
    assert out.dtype == jnp.float32
    out = get_lowering(aten.mul.Tensor)(jnp.ones(3, jnp.bfloat16), jnp.asarray(2.5))
    assert out.dtype == jnp.bfloat16


def test_division_modes_remainder_pow() -> None:
    a, c = T(4, 3, dtype=i64, low=-9, high=9), T(3, dtype=i64, low=1, high=4)
    for mode in ["trunc", "floor"]:
        check(aten.div.Tensor_mode, a, c, rounding_mode=mode)
        check(aten.div.Tensor_mode, a.float(), c.float(), rounding_mode=mode)
        check(aten.div.Scalar_mode, a, -3, rounding_mode=mode)
    check(aten.floor_divide.default, a, c)
    check(aten.remainder.Tensor, a, -c)
    check(aten.remainder.Scalar, a.float(), 2.5)
    check(aten.fmod.Tensor, a, c)
    check(aten.fmod.Scalar, a.float(), 2.5)
    check(aten.pow.Tensor_Tensor, T(3, 4, low=0.5, high=2), T(4, low=-2, high=2))
    check(aten.pow.Tensor_Tensor, T(3, dtype=i64, low=0, high=4), T(3, dtype=i64, low=0, high=3))
    check(aten.pow.Scalar, 2, T(3, 2))
    check(aten.pow.Scalar, 2.0, T(3, dtype=i64, low=0, high=4))


@pytest.mark.parametrize("name", ["maximum", "minimum", "atan2", "hypot", "copysign", "logaddexp", "fmax",
                                  "fmin", "nextafter", "xlogy", "heaviside"])
def test_other_binary(name: str) -> None:
    packet = getattr(aten, name)
    op = packet.Tensor if "Tensor" in packet.overloads() else packet.default
    check(op, T(3, 4), T(4))
    if name in ("maximum", "minimum"):
        check(op, T(3, 4, dtype=i64), T(4, dtype=i64))
        check(op, torch.tensor([1.0, float("nan")]), torch.tensor([float("nan"), 2.0]))


def test_comparisons_logical_bitwise() -> None:
    for name in ["eq", "ne", "lt", "le", "gt", "ge"]:
        check(getattr(aten, name).Tensor, T(3, 4, dtype=i64, low=0, high=3), T(4, low=0, high=3))
        check(getattr(aten, name).Tensor, T(3, 4, dtype=bf16), T(3, 4, dtype=f32))
        check(getattr(aten, name).Scalar, T(3, 4, dtype=i64, low=0, high=3), 1.5)
    for name in ["logical_and", "logical_or", "logical_xor"]:
        check(getattr(aten, name).default, T(3, 4), T(3, 4, dtype=b))
    for name in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
        check(getattr(aten, name).Tensor, T(3, 4, dtype=i64, low=0, high=100), T(4, dtype=i64, low=0, high=100))
        check(getattr(aten, name).Tensor, T(3, dtype=b), T(3, dtype=b))
        check(getattr(aten, name).Scalar, T(3, dtype=i64, low=0, high=100), 6)


def test_where_clamp_masked_fill_lerp_addc() -> None:
    check(aten.where.self, T(3, 4, dtype=b), T(3, 4), T(4, dtype=i64))
    check(aten.where.self, T(3, 1, dtype=b), T(1, 4, dtype=bf16), T(dtype=f32))
    check(aten.where.ScalarOther, T(3, 4, dtype=b), T(3, 4, dtype=i64), 0.5)
    check(aten.where.ScalarSelf, T(3, 4, dtype=b), 2, T(3, 4, dtype=bf16))
    check(aten.clamp.default, T(3, 4), -0.5, 0.5)
    check(aten.clamp.default, T(3, 4, dtype=i64, low=-5, high=5), None, 2)
    check(aten.clamp.default, T(3, 4, dtype=i64, low=-5, high=5), 0.5)
    check(aten.clamp.default, torch.tensor([float("nan"), 1.0, 5.0]), 0.0, 2.0)
    check(aten.clamp.Tensor, T(3, 4), T(4, low=-2, high=0), T(3, 1, low=0, high=2))
    check(aten.clamp_min.default, T(5), 0.0)
    check(aten.clamp_max.default, T(5, dtype=bf16), 0.0)
    check(aten.masked_fill.Scalar, T(3, 4), T(3, 4, dtype=b), float("-inf"))
    check(aten.masked_fill.Scalar, T(3, 4, dtype=i64), T(4, dtype=b), 7)
    check(aten.masked_fill.Tensor, T(3, 4, dtype=bf16), T(1, 4, dtype=b), torch.tensor(2.5))
    check(aten.lerp.Scalar, T(3, 4), T(3, 4), 0.3)
    check(aten.lerp.Scalar, T(3, 4, dtype=bf16), T(4, dtype=bf16), 0.9)
    check(aten.lerp.Tensor, T(3, 4), T(3, 4), T(4, low=0, high=1))
    check(aten.addcmul.default, T(3, 4), T(4), T(3, 1), value=0.5)
    check(aten.addcdiv.default, T(3, 4), T(4), T(3, 1, low=1, high=2), value=-2)
    check(aten.addcmul.default, T(3, dtype=i64), T(3, dtype=i64), T(3, dtype=i64), value=3)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_activations(dtype: torch.dtype) -> None:
    x, g = T(4, 5, dtype=dtype, low=-3, high=3), T(4, 5, dtype=dtype)
    for approx in ["none", "tanh"]:
        check(aten.gelu.default, x, approximate=approx)
        check(aten.gelu_backward.default, g, x, approximate=approx)
    check(aten.silu.default, x)
    check(aten.silu_backward.default, g, x)
    s = torch.sigmoid(x)
    check(aten.sigmoid_backward.default, g, s)
    check(aten.tanh_backward.default, g, torch.tanh(x))
    check(aten.threshold_backward.default, g, x, 0)
    check(aten.threshold.default, x, 0.5, -1.0)
    check(aten.leaky_relu.default, x, 0.2)
    check(aten.leaky_relu_backward.default, g, x, 0.2, False)
    check(aten.elu.default, x, 1.0, 1.0, 1.0)
    check(aten.elu_backward.default, g, 1.0, 1.0, 1.0, False, x)
    check(aten.hardtanh.default, x, -1.0, 1.0)
    check(aten.hardtanh_backward.default, g, x, -1.0, 1.0)
    check(aten.softplus.default, x, 1.0, 20.0)
    check(aten.softplus_backward.default, g, x, 2.0, 1.0)
    for name in ["mish", "hardswish", "hardsigmoid", "relu"]:
        check(getattr(aten, name).default, x)
    check(aten.glu.default, x.reshape(5, 4), -1)
    check(aten.log_sigmoid_forward.default, x)
    check(aten._prelu_kernel.default, x.reshape(4, 5, 1), T(5, 1, dtype=dtype))


def test_jit_representatives() -> None:
    check(aten.add.Tensor, T(3, 4, dtype=i64), 2.5, jit=True)
    check(aten.gelu.default, T(3, 4, dtype=bf16), approximate="tanh", jit=True)
    check(aten.where.ScalarOther, T(3, 4, dtype=b), T(3, 4), 0.0, jit=True)
