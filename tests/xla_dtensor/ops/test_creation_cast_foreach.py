"""Factories, dtype casts, the _foreach_* family, dtype promotion and the decomposition fallback vs torch."""
from __future__ import annotations

import itertools

import jax.numpy as jnp
import pytest
import torch

from tests.xla_dtensor.ops.harness import T, assert_match, check, to_jnp
from xla_dtensor.ops import decomposed_lowering, get_lowering, missing_lowering_error
from xla_dtensor.ops.dtypes import result_type

aten = torch.ops.aten
f32, bf16, f16, f64, i64, i32, u8, b = (torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int64,
                                        torch.int32, torch.uint8, torch.bool)


def test_factories() -> None:
    for fill in [7, 2.5, True]:
        check(aten.full.default, [2, 3], fill)
        check(aten.full_like.default, T(2, dtype=i64), fill)
        check(aten.new_full.default, T(2, dtype=bf16), [3], fill)
    check(aten.full.default, [0, 3], 1.0, dtype=bf16)
    check(aten.zeros.default, [2, 3])
    check(aten.ones.default, [4], dtype=i64)
    check(aten.zeros_like.default, T(2, 3, dtype=b))
    check(aten.ones_like.default, T(2, 3), dtype=i64)
    check(aten.new_zeros.default, T(2, dtype=i64), [2, 2])
    check(aten.new_ones.default, T(2, dtype=i64), [3], dtype=f32)
    check(aten.scalar_tensor.default, 3)
    check(aten.scalar_tensor.default, 2.5, dtype=bf16)
    check(aten.fill.Scalar, T(2, 3, dtype=i64), 4)
    check(aten.zero.default, T(2, 3))
    assert get_lowering(aten.empty.memory_format)([2, 3]).shape == (2, 3)
    for args in [(5,), (2, 9), (1, 10, 3), (0.5, 3.0, 0.25), (10, 0, -3), (3, 3), (0, 1, 0.1)]:
        check(aten.arange.start_step if len(args) == 3 else aten.arange.start if len(args) == 2
              else aten.arange.default, *args)
    check(aten.arange.default, 5, dtype=f32)
    for steps in [0, 1, 7]:
        check(aten.linspace.default, 0, 1, steps)
        check(aten.linspace.default, -3, 10, steps, dtype=i64)
    check(aten.eye.default, 3)
    check(aten.eye.m, 2, 4, dtype=i64)
    for diag in [-1, 0, 2]:
        check(aten.tril.default, T(3, 4), diag)
        check(aten.triu.default, T(2, 3, 4, dtype=i64), diag)
    check(aten.tril_indices.default, 4, 3, 1)
    check(aten.triu_indices.default, 3, 5, -1)


@pytest.mark.parametrize("src,dst", list(itertools.product([f32, bf16, i64, b], [f32, bf16, f16, f64, i64, i32, b])))
def test_to_copy(src: torch.dtype, dst: torch.dtype) -> None:
    x = T(3, 4, dtype=src, low=-3, high=3) if src != f32 else torch.tensor([[-2.7, -0.5, 0.0, 0.4], [1.5, 2.5, 3.9, -0.0],
                                                                            [1e3, -1e3, 0.1, 7.0]])
    if dst == u8:
        x = x.abs()
    check(aten._to_copy.default, x, dtype=dst)


def test_copy_clone_convert() -> None:
    check(aten.copy.default, T(3, 4, dtype=bf16), T(4))
    check(aten.copy.default, T(3, 4, dtype=i64), T(3, 4))
    check(aten.clone.default, T(3, 4, dtype=bf16))
    check(torch.ops.prims.convert_element_type.default, T(3, 4), bf16)
    assert get_lowering(aten.copy_.default) is get_lowering(aten.copy.default)  # in-place -> functional
    assert get_lowering(aten.add_.Tensor) is get_lowering(aten.add.Tensor)


DTYPES = [b, u8, i32, i64, bf16, f16, f32, f64]


def test_result_type_matches_torch() -> None:
    shapes = {"dim": (2,), "zero": ()}
    cases = 0
    for (da, ka), (db, kb) in itertools.product(itertools.product(DTYPES, shapes), repeat=2):
        x, y = torch.zeros(shapes[ka], dtype=da), torch.zeros(shapes[kb], dtype=db)
        assert result_type(to_jnp(x), to_jnp(y)) == torch.result_type(x, y), (da, ka, db, kb)
        cases += 1
    for d, s in itertools.product(DTYPES, [True, 3, 2.5]):
        x = torch.zeros(2, dtype=d)
        assert result_type(to_jnp(x), s) == torch.result_type(x, s), (d, s)
    assert cases == 256


FOREACH = [
    (aten._foreach_add.List, lambda xs: (xs, [x * 2 for x in xs]), {"alpha": 0.5}),
    (aten._foreach_add.Scalar, lambda xs: (xs, 3.0), {}),
    (aten._foreach_add.Tensor, lambda xs: (xs, torch.tensor(2.0)), {"alpha": 2}),
    (aten._foreach_add.ScalarList, lambda xs: (xs, [1.0, -2.0, 3]), {}),
    (aten._foreach_sub.Scalar, lambda xs: (xs, 1.5), {}),
    (aten._foreach_mul.Scalar, lambda xs: (xs, 0.9), {}),
    (aten._foreach_mul.Tensor, lambda xs: (xs, torch.tensor(0.3)), {}),
    (aten._foreach_mul.List, lambda xs: (xs, xs), {}),
    (aten._foreach_div.List, lambda xs: (xs, [x.abs() + 1 for x in xs]), {}),
    (aten._foreach_div.Scalar, lambda xs: (xs, 4.0), {}),
    (aten._foreach_div.ScalarList, lambda xs: (xs, [2.0, 3.0, 4.0]), {}),
    (aten._foreach_div.Tensor, lambda xs: (xs, torch.tensor(3.0)), {}),
    (aten._foreach_sqrt.default, lambda xs: ([x.abs() for x in xs],), {}),
    (aten._foreach_neg.default, lambda xs: (xs,), {}),
    (aten._foreach_reciprocal.default, lambda xs: ([x.abs() + 1 for x in xs],), {}),
    (aten._foreach_zero.default, lambda xs: (xs,), {}),
    (aten._foreach_addcmul.Scalar, lambda xs: (xs, xs, xs, 0.1), {}),
    (aten._foreach_addcmul.ScalarList, lambda xs: (xs, xs, xs, [0.1, 0.2, 0.3]), {}),
    (aten._foreach_addcmul.Tensor, lambda xs: (xs, xs, xs, torch.tensor([0.1, 0.2, 0.3])), {}),
    (aten._foreach_addcdiv.Scalar, lambda xs: (xs, xs, [x.abs() + 1 for x in xs], -0.5), {}),
    (aten._foreach_addcdiv.ScalarList, lambda xs: (xs, xs, [x.abs() + 1 for x in xs], [1.0, 2.0, 3.0]), {}),
    (aten._foreach_lerp.Scalar, lambda xs: (xs, [x * 3 for x in xs], 0.1), {}),
    (aten._foreach_lerp.List, lambda xs: (xs, [x * 3 for x in xs], [x.abs() for x in xs]), {}),
    (aten._foreach_maximum.List, lambda xs: (xs, [-x for x in xs]), {}),
    (aten._foreach_clamp_min.Scalar, lambda xs: (xs, 0.0), {}),
    (aten._foreach_pow.Scalar, lambda xs: (xs, 2), {}),
    (aten._foreach_pow.ScalarAndTensor, lambda xs: (0.9, xs), {}),
    (aten._foreach_pow.List, lambda xs: ([x.abs() + 0.5 for x in xs], xs), {}),
    (aten._foreach_copy.default, lambda xs: (xs, [x + 1 for x in xs]), {}),
    (aten._foreach_norm.Scalar, lambda xs: (xs, 2), {}),
    (aten._foreach_norm.Scalar, lambda xs: (xs, float("inf")), {}),
    (aten._foreach_exp.default, lambda xs: (xs,), {}),
]


@pytest.mark.parametrize("op,make,kw", FOREACH, ids=[f"{o}" for o, _, _ in FOREACH])
def test_foreach(op: object, make: object, kw: dict) -> None:
    xs = [T(3, 2), T(4), T()]
    check(op, *make(xs), **kw, strides=False)
    packet = getattr(aten, op._schema.name.split("::")[1] + "_", None)
    inplace = getattr(packet, op._overloadname, None) if packet is not None else None
    if inplace is not None:
        assert get_lowering(inplace) is get_lowering(op)


def test_foreach_bf16_and_adam_style_update() -> None:
    xs = [T(3, 2, dtype=bf16), T(5, dtype=bf16)]
    check(aten._foreach_lerp.Scalar, xs, [T(3, 2, dtype=bf16), T(5, dtype=bf16)], 0.1, strides=False)
    check(aten._foreach_add.List, xs, [T(3, 2), T(5)], strides=False)


def test_decomposition_fallback_and_missing_error() -> None:
    x = T(3, 4)
    for op, args in [(aten.hardshrink.default, (x, 0.5)), (aten.softshrink.default, (x, 0.3)),
                     (aten.native_group_norm_backward.default, None)]:
        if args is None:
            continue
        assert get_lowering(op) is None
        fn = decomposed_lowering(op, tuple(to_jnp(a) for a in args), {})
        assert_match(fn(*[to_jnp(a) for a in args]), op(*args), str(op))
    # the same signature reuses the cached graph; a different shape traces again
    fn2 = decomposed_lowering(aten.hardshrink.default, (to_jnp(T(5)), 0.5), {})
    assert_match(fn2(to_jnp(torch.arange(5.0) - 2), 0.5), aten.hardshrink.default(torch.arange(5.0) - 2, 0.5))
    err = missing_lowering_error(aten.nonzero_static.default, (jnp.zeros((2, 3), jnp.float32),), {"size": 4})
    assert "aten.nonzero_static.default" in str(err) and "float32[2, 3]" in str(err) and "size=4" in str(err)
    with pytest.raises(NotImplementedError, match="_fft_r2c"):
        decomposed_lowering(aten._fft_r2c.default, (jnp.zeros(4),), {"dim": [0], "normalization": 0,
                                                                     "onesided": True})
