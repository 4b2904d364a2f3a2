"""Reductions, scans and sorting against torch CPU eager."""
from __future__ import annotations

import pytest
import torch

from tests.xla_dtensor.ops.harness import T, check

aten = torch.ops.aten
f32, bf16, f64, i64, b = torch.float32, torch.bfloat16, torch.float64, torch.int64, torch.bool


@pytest.mark.parametrize("dtype", [f32, bf16, i64, b])
def test_sum_prod(dtype: torch.dtype) -> None:
    x = T(3, 4, 2, dtype=dtype, low=-3, high=3)
    check(aten.sum.default, x)
    check(aten.sum.dim_IntList, x, [0, 2])
    check(aten.sum.dim_IntList, x, [-1], True)
    check(aten.sum.dim_IntList, x, [], dtype=f64)
    check(aten.sum.default, T(0, 3, dtype=dtype))
    check(aten.sum.default, T(dtype=dtype))
    check(aten.prod.default, x[:2, :2])
    check(aten.prod.dim_int, x, 1, True)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_mean_var_std(dtype: torch.dtype) -> None:
    x = T(4, 5, dtype=dtype)
    check(aten.mean.default, x)
    check(aten.mean.dim, x, [1], True)
    check(aten.mean.dim, x, [0, 1])
    check(aten.var.correction, x, [1], correction=0)
    check(aten.var.correction, x, None, keepdim=True)
    check(aten.var.dim, x, [0], False, True)
    check(aten.std.correction, x, [0, 1], correction=1, keepdim=False)
    check(aten.var_mean.correction, x, [1], correction=1)
    check(aten.std_mean.correction, x, [0])
    check(aten.var.default, x, False)


def test_mean_of_int_is_an_error() -> None:
    import jax.numpy as jnp
    from xla_dtensor.ops import get_lowering
    with pytest.raises(RuntimeError):
        aten.mean.default(T(3, dtype=i64))
    with pytest.raises(TypeError, match="int64"):
        get_lowering(aten.mean.default)(jnp.zeros(3, jnp.int64))
    check(aten.mean.dim, T(3, 2, dtype=i64), [0], dtype=f32)


@pytest.mark.parametrize("dtype", [f32, bf16, i64, b])
def test_extremes_and_args(dtype: torch.dtype) -> None:
    x = T(3, 5, dtype=dtype, low=-4, high=4) if dtype != f32 else torch.randperm(15).float().reshape(3, 5)
    check(aten.amax.default, x, [1])
    check(aten.amin.default, x, [0, 1], True)
    check(aten.max.default, x)
    check(aten.min.default, x)
    if dtype == b:
        return
    xd = torch.randperm(15).to(dtype).reshape(3, 5)  # distinct values: unique arg indices
    check(aten.argmax.default, xd)
    check(aten.argmax.default, xd, 1, True)
    check(aten.argmin.default, xd, 0)
    check(aten.max.dim, xd, 1)
    check(aten.min.dim, xd, 0, True)


def test_nan_propagation_in_max() -> None:
    x = torch.tensor([[1.0, float("nan"), 3.0], [4.0, 5.0, 6.0]])
    check(aten.amax.default, x, [1])
    check(aten.max.dim, x, 1)
    check(aten.argmax.default, x, 1)


def test_any_all_count_norms_logsumexp() -> None:
    for x in [T(3, 4, dtype=b), T(3, 4, dtype=i64, low=0, high=2), T(3, 4, dtype=torch.uint8, low=0, high=2)]:
        check(aten.any.default, x)
        check(aten.all.dim, x, 1)
        check(aten.any.dims, x, [0, 1], True)
    check(aten.count_nonzero.dim_IntList, T(3, 4, dtype=i64, low=0, high=2), [1])
    x = T(3, 4)
    for ord in [2, 1, 0, 3.5, float("inf"), float("-inf")]:
        check(aten.linalg_vector_norm.default, x, ord)
        check(aten.linalg_vector_norm.default, x, ord, [1], True)
    check(aten.linalg_vector_norm.default, T(3, 4, dtype=bf16), 2, [0], dtype=f32)
    check(aten.norm.Scalar, x, 2)
    check(aten.logsumexp.default, x, [1])
    check(aten.logsumexp.default, torch.tensor([[float("-inf"), float("-inf")], [1.0, 2.0]]), [1], True)
    check(aten.logsumexp.default, T(3, 4, dtype=i64), [0])


@pytest.mark.parametrize("dtype", [f32, i64, b])
def test_scans(dtype: torch.dtype) -> None:
    x = T(3, 4, dtype=dtype, low=-2, high=3)
    check(aten.cumsum.default, x, 1)
    check(aten.cumsum.default, x, 0, dtype=f64)
    check(aten.cumprod.default, x, -1)
    if dtype != b:
        check(aten.cummax.default, x, 1)
        check(aten.cummin.default, x, 0)
    check(aten.logcumsumexp.default, T(3, 4), 1)
    check(aten.cummax.default, torch.tensor([1.0, float("nan"), 3.0, float("nan"), 0.0]), 0)


@pytest.mark.parametrize("dtype", [f32, bf16, i64])
def test_sort_topk(dtype: torch.dtype) -> None:
    x = torch.randperm(20).to(dtype).reshape(4, 5)
    for desc in [False, True]:
        check(aten.sort.default, x, 1, desc)
        check(aten.sort.default, x, 0, desc)
        check(aten.sort.stable, T(4, 6, dtype=i64, low=0, high=3), stable=True, dim=1, descending=desc)
    check(aten.topk.default, x, 3)
    check(aten.topk.default, x, 2, 0, False)
    check(aten.argsort.default, x, 1, True)
    check(aten.kthvalue.default, x, 2, 1)
    check(aten.median.dim, x, 1)
    check(aten.median.default, x)


def test_sort_nan_order() -> None:
    x = torch.tensor([3.0, float("nan"), -1.0, float("inf"), 0.5])
    check(aten.sort.default, x, 0, False)
    check(aten.sort.default, x, 0, True)


def test_searchsorted() -> None:
    s = torch.sort(T(10)).values
    check(aten.searchsorted.Tensor, s, T(4, 3))
    check(aten.searchsorted.Tensor, s, T(5), right=True, out_int32=True)
