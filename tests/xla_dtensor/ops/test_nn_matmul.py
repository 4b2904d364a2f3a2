"""Matmul, normalization, softmax, loss, convolution, pooling and attention lowerings vs torch CPU."""
from __future__ import annotations

import pytest
import torch

from tests.xla_dtensor.ops.harness import T, check

aten = torch.ops.aten
f32, bf16, i64, b = torch.float32, torch.bfloat16, torch.int64, torch.bool
LOOSE = (1e-4, 1e-4)


@pytest.mark.parametrize("dtype", [f32, bf16, i64])
def test_matmul_family(dtype: torch.dtype) -> None:
    tol = (2e-2, 5e-2) if dtype == bf16 else LOOSE
    a, c = T(3, 4, dtype=dtype), T(4, 5, dtype=dtype)
    check(aten.mm.default, a, c, tol=tol)
    check(aten.bmm.default, T(2, 3, 4, dtype=dtype), T(2, 4, 2, dtype=dtype), tol=tol)
    check(aten.addmm.default, T(5, dtype=dtype), a, c, tol=tol)
    check(aten.addmm.default, T(3, 5, dtype=dtype), a, c, beta=2, alpha=3, tol=tol)
    check(aten.baddbmm.default, T(2, 3, 2, dtype=dtype), T(2, 3, 4, dtype=dtype), T(2, 4, 2, dtype=dtype), tol=tol)
    check(aten.addbmm.default, T(3, 2, dtype=dtype), T(2, 3, 4, dtype=dtype), T(2, 4, 2, dtype=dtype), tol=tol)
    check(aten.mv.default, a, T(4, dtype=dtype), tol=tol)
    check(aten.dot.default, T(4, dtype=dtype), T(4, dtype=dtype), tol=tol)
    check(aten.addmv.default, T(3, dtype=dtype), a, T(4, dtype=dtype), tol=tol)
    check(aten.mm.default, T(0, 4, dtype=dtype), c)
    check(aten.mm.default, T(3, 0, dtype=dtype), T(0, 5, dtype=dtype))
    if dtype.is_floating_point:
        for gelu in (False, True):
            check(aten._addmm_activation.default, T(5, dtype=dtype), a, c, beta=2, use_gelu=gelu, tol=tol)


def test_addmm_ignores_nan_bias_when_beta_is_zero() -> None:
    check(aten.addmm.default, torch.full((3, 2), float("nan")), T(3, 4), T(4, 2), beta=0, tol=LOOSE)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_layer_norm_and_backward(dtype: torch.dtype) -> None:
    x, w, bias = T(2, 3, 8, dtype=dtype), T(8, dtype=dtype), T(8, dtype=dtype)
    tol = None if dtype == bf16 else LOOSE
    check(aten.native_layer_norm.default, x, [8], w, bias, 1e-5, tol=tol)
    check(aten.native_layer_norm.default, x, [3, 8], None, None, 1e-5, tol=tol)
    _, mean, rstd = aten.native_layer_norm.default(x, [8], w, bias, 1e-5)
    g = T(2, 3, 8, dtype=dtype)
    check(aten.native_layer_norm_backward.default, g, x, [8], mean, rstd, w, bias, [True, True, True],
          tol=(5e-2, 5e-2) if dtype == bf16 else LOOSE)
    check(aten.native_layer_norm_backward.default, g, x, [8], mean, rstd, None, None, [True, False, False],
          tol=(5e-2, 5e-2) if dtype == bf16 else LOOSE)


@pytest.mark.parametrize("dtype", [f32, bf16])
def test_softmax_family(dtype: torch.dtype) -> None:
    x = T(3, 4, 5, dtype=dtype, low=-4, high=4)
    for op in [aten._softmax.default, aten._log_softmax.default]:
        check(op, x, -1, False)
        check(op, x, 1, False)
    out = torch.softmax(x, -1)
    g = T(3, 4, 5, dtype=dtype)
    check(aten._softmax_backward_data.default, g, out, -1, dtype)
    check(aten._log_softmax_backward_data.default, g, torch.log_softmax(x, -1), -1, dtype)
    masked = x.masked_fill(torch.tensor([True, False, False, True, True]), float("-inf"))
    masked[0, 0] = float("-inf")
    check(aten._safe_softmax.default, masked, -1)


@pytest.mark.parametrize("reduction", [0, 1, 2])
def test_nll_loss(reduction: int) -> None:
    logp = torch.log_softmax(T(6, 4), -1)
    target = torch.tensor([0, 3, 1, -100, 2, 3])
    w = T(4, low=0.5, high=2)
    for weight in [None, w]:
        out, total = aten.nll_loss_forward.default(logp, target, weight, reduction, -100)
        check(aten.nll_loss_forward.default, logp, target, weight, reduction, -100)
        g = T(6) if reduction == 0 else T()
        check(aten.nll_loss_backward.default, g, logp, target, weight, reduction, -100, total, strides=False)
    check(aten.nll_loss_forward.default, torch.log_softmax(T(4), -1), torch.tensor(2), None, reduction, -100)
    lp2 = torch.log_softmax(T(2, 3, 2, 2), 1)
    t2 = torch.tensor([[[0, 1], [2, 2]], [[1, 0], [0, 2]]])
    out, total = aten.nll_loss2d_forward.default(lp2, t2, None, reduction, -100)
    check(aten.nll_loss2d_forward.default, lp2, t2, None, reduction, -100)
    check(aten.nll_loss2d_backward.default, T(*out.shape), lp2, t2, None, reduction, -100, total, strides=False)


def test_mse_batch_group_norm() -> None:
    x, y = T(3, 4), T(3, 4)
    for r in [0, 1, 2]:
        check(aten.mse_loss.default, x, y, r)
        check(aten.mse_loss_backward.default, T(3, 4) if r == 0 else T(), x, y, r)
    xb, w, bias = T(4, 3, 2, 2), T(3), T(3)
    rm, rv = T(3), T(3, low=0.5, high=2)
    check(aten._native_batch_norm_legit_functional.default, xb, w, bias, rm, rv, True, 0.1, 1e-5, tol=LOOSE, strides=False)
    check(aten._native_batch_norm_legit_functional.default, xb, w, bias, rm, rv, False, 0.1, 1e-5, tol=LOOSE, strides=False)
    check(aten._native_batch_norm_legit_no_training.default, xb, w, bias, rm, rv, 0.1, 1e-5, tol=LOOSE, strides=False)
    _, sm, si = aten._native_batch_norm_legit.no_stats(xb, w, bias, True, 0.1, 1e-5)
    check(aten._native_batch_norm_legit.no_stats, xb, w, bias, True, 0.1, 1e-5, tol=LOOSE, strides=False)
    check(aten.native_batch_norm_backward.default, T(4, 3, 2, 2), xb, w, rm, rv, sm, si, True, 1e-5,
          [True, True, True], tol=LOOSE, strides=False)  # torch's kernel requires contiguous input
    check(aten.native_batch_norm_backward.default, T(4, 3, 2, 2), xb, w, rm, rv, None, None, False, 1e-5,
          [True, True, True], tol=LOOSE, strides=False)
    check(aten.native_group_norm.default, T(2, 6, 3), T(6), T(6), 2, 6, 3, 3, 1e-5, tol=LOOSE, strides=False)


CONVS = [  # (input shape, weight shape, stride, padding, dilation, transposed, output_padding, groups)
    ((2, 4, 7, 6), (6, 2, 3, 2), [1, 1], [0, 0], [1, 1], False, [0, 0], 2),
    ((1, 3, 8, 8), (4, 3, 3, 3), [2, 1], [1, 2], [2, 1], False, [0, 0], 1),
    ((2, 3, 9), (5, 3, 4), [2], [1], [1], False, [0], 1),
    ((1, 4, 5, 5), (4, 3, 3, 3), [2, 2], [1, 0], [1, 1], True, [1, 0], 1),
    ((1, 4, 5, 5), (4, 1, 2, 3), [1, 2], [0, 1], [2, 1], True, [0, 1], 2),
]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: f"{len(c[0]) - 2}d{'T' if c[5] else ''}g{c[7]}")
def test_convolution_and_backward(case: tuple) -> None:
    xs, ws, stride, pad, dil, transposed, opad, groups = case
    x, w = T(*xs), T(*ws)
    cout = ws[1] * groups if transposed else ws[0]
    bias = T(cout)
    check(aten.convolution.default, x, w, bias, stride, pad, dil, transposed, opad, groups, tol=LOOSE)
    out = aten.convolution.default(x, w, bias, stride, pad, dil, transposed, opad, groups)
    check(aten.convolution_backward.default, T(*out.shape), x, w, [cout], stride, pad, dil, transposed, opad,
          groups, [True, True, True], tol=LOOSE)


def test_conv_bf16() -> None:
    check(aten.convolution.default, T(1, 2, 5, 5, dtype=bf16), T(3, 2, 3, 3, dtype=bf16), None, [1, 1], [1, 1],
          [1, 1], False, [0, 0], 1, tol=(3e-2, 5e-2))


@pytest.mark.parametrize("ceil_mode", [False, True])
def test_pooling(ceil_mode: bool) -> None:
    x = T(2, 3, 7, 6)
    for k, s, p, d in [([3, 3], [2, 2], [1, 1], [1, 1]), ([2, 3], [], [0, 1], [2, 1])]:
        check(aten.max_pool2d_with_indices.default, x, k, s, p, d, ceil_mode)
        out, idx = aten.max_pool2d_with_indices.default(x, k, s, p, d, ceil_mode)
        check(aten.max_pool2d_with_indices_backward.default, T(*out.shape), x, k, s, p, d, ceil_mode, idx,
              strides=False)  # torch's kernel requires contiguous grad
    check(aten.max_pool2d_with_indices.default, T(3, 5, 5), [2, 2], [2, 2], [0, 0], [1, 1], ceil_mode)
    for cip in [True, False]:
        for div in [None, 5]:
            args = (x, [3, 2], [2, 2], [1, 1], ceil_mode, cip, div)
            check(aten.avg_pool2d.default, *args)
            out = aten.avg_pool2d.default(*args)
            check(aten.avg_pool2d_backward.default, T(*out.shape), *args, strides=False)
    check(aten._adaptive_avg_pool2d.default, x, [3, 4])
    check(aten._adaptive_avg_pool2d_backward.default, T(2, 3, 3, 4), x)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_flash_cpu_and_backward(causal: bool) -> None:
    q, k, v = T(2, 2, 5, 4), T(2, 2, 5, 4), T(2, 2, 5, 4)
    op = aten._scaled_dot_product_flash_attention_for_cpu.default
    # NOTE: torch's kernel silently returns wrong values when the head dim is not stride-1, so no stride check
    check(op, q, k, v, 0.0, causal, tol=LOOSE, strides=False)
    check(op, q, k, v, 0.0, causal, scale=0.3, tol=LOOSE, strides=False)
    mask = T(5, 5)
    check(op, q, k, v, 0.0, False, attn_mask=mask, tol=LOOSE, strides=False)
    out, lse = op(q, k, v, 0.0, causal)
    check(aten._scaled_dot_product_flash_attention_for_cpu_backward.default, T(2, 2, 5, 4), q, k, v, out, lse,
          0.0, causal, tol=LOOSE, strides=False)


def test_sdpa_math_and_efficient_against_flash() -> None:
    import jax.numpy as jnp
    import numpy as np
    from tests.xla_dtensor.ops.harness import to_jnp
    from xla_dtensor.ops import get_lowering
    q, k, v = T(1, 2, 4, 8), T(1, 2, 6, 8), T(1, 2, 6, 8)
    mask = T(4, 6, dtype=b)
    mask[:, 0] = True
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    math_out = get_lowering(aten._scaled_dot_product_attention_math.default)(*map(to_jnp, (q, k, v, mask)))[0]
    eff = get_lowering(aten._scaled_dot_product_efficient_attention.default)(*map(to_jnp, (q, k, v)),
                                                                               None, True)
    ref_eff = torch.nn.functional.scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(np.asarray(math_out), ref.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(eff[0]), ref_eff.numpy(), rtol=1e-5, atol=1e-5)
    assert eff[1].shape == (1, 2, 4) and eff[1].dtype == jnp.float32
