"""Strategies added for Llama / ViT / the lazy IR, run shard-by-shard with JAX on a 2x4 mesh vs numpy."""
from __future__ import annotations

from tests.autoshard._shard_check import check_op, local, node_strategies  # noqa: I001

import jax
import jax.numpy as jnp
import numpy as np
import pytest

rng = np.random.default_rng(1)


def _r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _check(op, inputs, args, expected, local_fn, min_count):
    strategies, _ = node_strategies(op, inputs, args, [e.shape for e in expected])
    assert len(strategies) >= min_count, [s.name for s in strategies]
    return check_op(strategies, inputs, expected, local_fn)


def test_slice_backward_places_grad_in_zeros():
    g = _r(8, 4, 4)
    want = np.zeros((8, 4, 8), np.float32)
    want[:, :, 4:8] = g

    def fn(st, p):
        out = jnp.zeros(local((8, 4, 8), st.out_specs[0]), p.dtype)
        return [out.at[:, :, 4:8].set(p)]

    strategies, _ = node_strategies("aten.slice_backward.default", [g], (None, (8, 4, 8), -1, 4, 8, 1), [want.shape])
    assert all(p != ("S", 2) for st in strategies for p in st.out_specs[0])  # the sliced dim is never split
    assert any(p == ("S", 1) for st in strategies for p in st.out_specs[0])
    check_op(strategies, [g], [want], fn)


def test_select_backward_inserts_dim():
    g = _r(8, 4)
    want = np.zeros((8, 3, 4), np.float32)
    want[:, 1] = g
    _check("aten.select_backward.default", [g], (None, (8, 3, 4), 1, 1), [want],
           lambda st, p: [jnp.zeros(local((8, 3, 4), st.out_specs[0]), p.dtype).at[:, 1].set(p)], min_count=4)


@pytest.mark.parametrize("op,ref", [("aten.tril.default", np.tril), ("aten.triu.default", np.triu)])
def test_triangular_keeps_matrix_dims_whole(op, ref):
    x = _r(8, 4, 4)
    jref = jnp.tril if ref is np.tril else jnp.triu
    strategies, _ = node_strategies(op, [x], (None, 0), [x.shape])
    assert all(p in ("R", ("S", 0)) for st in strategies for p in st.in_specs[0])
    assert len(strategies) >= 3
    check_op(strategies, [x], [ref(x)], lambda st, p: [jref(p)])


@pytest.mark.parametrize("op,fn,ref", [("aten.cos.default", jnp.cos, np.cos), ("aten.sin.default", jnp.sin, np.sin)])
def test_cos_sin_elementwise(op, fn, ref):
    x = _r(8, 16)
    _check(op, [x], (None,), [ref(x)], lambda st, p: [fn(p)], min_count=6)


def test_fill_inplace_is_elementwise():
    x = _r(8, 16)
    _check("aten.fill_.Scalar", [x], (None, 2.5), [np.full_like(x, 2.5)], lambda st, p: [jnp.full_like(p, 2.5)],
           min_count=6)


def test_mse_loss_and_backward():
    x, y = _r(8, 16), _r(8, 16)
    n = x.size

    def fwd(st, p, q):
        return [jnp.sum((p - q) ** 2) / n]  # a split dim leaves a Partial sum of the global mean

    _check("aten.mse_loss.default", [x, y], (None, None, 1), [np.mean((x - y) ** 2)], fwd, min_count=6)
    g = np.asarray(0.7, np.float32)
    _check("aten.mse_loss_backward.default", [g, x, y], (None, None, None, 1), [0.7 * 2 * (x - y) / n],
           lambda st, gg, p, q: [gg * 2 * (p - q) / n], min_count=6)


def test_single_tensor_optimizer_updates_follow_the_updated_tensor():
    p, g, v = _r(8, 16), _r(8, 16), np.abs(_r(8, 16)) + 0.1
    strategies, _ = node_strategies("aten.addcdiv_.default", [p, g, v], (None, None, None, -0.01), [p.shape])
    assert len(strategies) >= 6
    check_op(strategies, [p, g, v], [p - 0.01 * g / v], lambda st, a, b, c: [a - 0.01 * b / c])
    _check("aten.lerp_.Scalar", [p, g], (None, None, 0.1), [p + 0.1 * (g - p)],
           lambda st, a, b: [a + 0.1 * (b - a)], min_count=6)


def test_complex_views_keep_the_real_imag_pair_whole():
    x = _r(8, 4, 6, 2)  # torchtitan's rotary: (batch, seq, heads, pairs) -> complex
    z = x[..., 0] + 1j * x[..., 1]
    strategies, _ = node_strategies("aten.view_as_complex.default", [x], (None,), [z.shape], ["complex64"])
    assert all(p != ("S", 3) for st in strategies for p in st.in_specs[0])
    assert {("S", 0), ("S", 2)} <= {p for st in strategies for p in st.in_specs[0]}  # split, not gathered
    check_op(strategies, [x], [z], lambda st, p: [jax.lax.complex(p[..., 0], p[..., 1])])
    zc = z.astype(np.complex64)
    strategies, _ = node_strategies("aten.view_as_real.default", [zc], (None,), [x.shape])
    assert all(p != ("S", 3) for st in strategies for p in st.out_specs[0])
    assert {("S", 0), ("S", 2)} <= {p for st in strategies for p in st.in_specs[0]}
    check_op(strategies, [zc], [x], lambda st, p: [jnp.stack([p.real, p.imag], -1)])
