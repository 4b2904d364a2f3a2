"""Strategies added for Llama / ViT / the lazy IR, run shard-by-shard with JAX on a 2x4 mesh vs numpy."""
from __future__ import annotations

from tests.autoshard._shard_check import check_op, local, node_strategies  # noqa: I001

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
