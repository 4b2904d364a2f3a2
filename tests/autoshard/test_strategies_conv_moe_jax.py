"""Convolution, batch norm, pooling, sort/topk and MoE routing rules, run shard-by-shard on 2x4 vs torch CPU / numpy."""
from __future__ import annotations

from tests.autoshard._shard_check import AXES, check_op, local, node_strategies, shard_index  # noqa: I001

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

rng = np.random.default_rng(4)
EPS, MOM = 1e-5, 0.1


def _r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _strategies(op, inputs, args, expected, min_count, out_dtypes=None, keep=None):
    """The op's strategies (at least ``min_count``); with ``keep``, only those named (each must exist)."""
    st, _ = node_strategies(op, inputs, args, [e.shape for e in expected], out_dtypes)
    assert len(st) >= min_count, [s.name for s in st]
    if keep is None:
        return st
    picked = [s for s in st if s.name in keep]
    assert {s.name for s in picked} == set(keep), sorted(s.name for s in st)
    return picked  # NOTE: a subset keeps the one-jit check small; every label and a few pairs are covered


def _conv(x, w):
    return jax.lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=("NCHW", "OIHW", "NCHW"))


def test_convolution_splits_batch_and_both_channel_dims():
    x, w, b = _r(4, 4, 6, 6), _r(8, 4, 3, 3), _r(8)
    tx, tw, tb = (torch.from_numpy(a).requires_grad_() for a in (x, w, b))
    out = torch.nn.functional.conv2d(tx, tw, tb, padding=1)
    args = (None, None, None, (1, 1), (1, 1), (1, 1), False, (0, 0), 1)
    st = _strategies("aten.convolution.default", [x, w, b], args, [out.detach().numpy()], min_count=10,
                     keep=("R,R", "n,R", "R,co", "ci,R", "n,co", "co,ci", "R,n"))  # data, out-, in-channel splits
    check_op(st, [x, w, b], [out.detach().numpy()], lambda s, p, q, c: [_conv(p, q) + c[None, :, None, None]])

    g = _r(*out.shape)
    out.backward(torch.from_numpy(g))
    want = [tx.grad.numpy(), tw.grad.numpy(), tb.grad.numpy()]
    bargs = (None, None, None, (8,), (1, 1), (1, 1), (1, 1), False, (0, 0), 1, (True, True, True))

    def backward(s, gg, p, q):
        _, vjp = jax.vjp(_conv, p, q)
        gx, gw = vjp(gg)
        return [gx, gw, gg.sum((0, 2, 3))]

    st = _strategies("aten.convolution_backward.default", [g, x, w], bargs, want, min_count=10,
                     keep=("n,R", "R,co", "ci,R", "n,co", "co,ci"))
    ci = next(s for s in st if s.name == "ci,R")
    assert ci.out_specs[2] == ("R", "R")  # the bias gradient does not depend on the input channels
    check_op(st, [g, x, w], want, backward, rtol=1e-3, atol=1e-3)


def _stats(p, s):
    """Per-channel sum, sum of squares and count over this device's batch/spatial part, reduced as ``s`` says."""
    names = tuple(AXES[a] for a in s.reduce_axes)
    tot = [p.sum((0, 2, 3)), (p * p).sum((0, 2, 3)), jnp.float32(p.size // p.shape[1])]
    return [jax.lax.psum(t, names) if names else t for t in tot]


def test_batch_norm_reduces_its_statistics_over_split_batch_and_space():
    x, w, b, rm, rv = _r(8, 4, 4, 4), _r(4), _r(4), _r(4), np.abs(_r(4)) + 0.5
    mean, var = x.mean((0, 2, 3)), x.var((0, 2, 3))
    n = x.size // 4
    inv = 1 / np.sqrt(var + EPS)
    y = (x - mean[:, None, None]) * inv[:, None, None] * w[:, None, None] + b[:, None, None]
    want = [y, mean, inv, (1 - MOM) * rm + MOM * mean, (1 - MOM) * rv + MOM * var * n / (n - 1)]

    def fwd(s, p, ww, bb, m, v):
        tot, sq, cnt = _stats(p, s)
        mu = tot / cnt
        va = sq / cnt - mu * mu
        iv = jax.lax.rsqrt(va + EPS)
        out = (p - mu[:, None, None]) * iv[:, None, None] * ww[:, None, None] + bb[:, None, None]
        return [out, mu, iv, (1 - MOM) * m + MOM * mu, (1 - MOM) * v + MOM * va * cnt / (cnt - 1)]

    st = _strategies("aten._native_batch_norm_legit_functional.default", [x, w, b, rm, rv],
                     (None,) * 5 + (True, MOM, EPS), want, min_count=10,
                     keep=("R,R", "n,R", "c,R", "R,s1", "n,s0", "c,n", "s0,s1"))
    assert any(s.reduce_axes == (0, 1) and s.out_specs[1] == ("R", "R") for s in st)
    check_op(st, [x, w, b, rm, rv], want, fwd, rtol=1e-3, atol=1e-3)

    g = _r(*x.shape)
    xhat = (x - mean[:, None, None]) * inv[:, None, None]
    gb, gw = g.sum((0, 2, 3)), (g * xhat).sum((0, 2, 3))
    gx = w[:, None, None] * inv[:, None, None] * (g - gb[:, None, None] / n - xhat * gw[:, None, None] / n)

    def bwd(s, gg, p, ww, m, v, sm, si):
        names = tuple(AXES[a] for a in s.reduce_axes)
        xh = (p - sm[:, None, None]) * si[:, None, None]
        sb, sw = gg.sum((0, 2, 3)), (gg * xh).sum((0, 2, 3))
        cnt = jnp.float32(p.size // p.shape[1])
        if names:
            sb, sw, cnt = (jax.lax.psum(t, names) for t in (sb, sw, cnt))
        dx = ww[:, None, None] * si[:, None, None] * (gg - sb[:, None, None] / cnt - xh * sw[:, None, None] / cnt)
        return [dx, sw, sb]

    ins = [g, x, w, rm, rv, mean, inv]
    st = _strategies("aten.native_batch_norm_backward.default", ins, (None,) * 7 + (True, EPS, (True,) * 3),
                     [gx, gw, gb], min_count=10, keep=("n,R", "c,R", "R,s1", "n,s0", "c,n"))
    check_op(st, ins, [gx, gw, gb], bwd, rtol=1e-3, atol=1e-3)


def test_pooling_splits_batch_and_channels_only():
    x = _r(8, 4, 4, 4)
    want = x.reshape(8, 4, 2, 2, 2, 2).mean((3, 5))
    st = _strategies("aten.avg_pool2d.default", [x], (None, (2, 2), (2, 2)), [want], min_count=6)
    assert all(p in ("R", ("S", 0), ("S", 1)) for s in st for p in s.in_specs[0])
    check_op(st, [x], [want], lambda s, p: [p.reshape(p.shape[0], p.shape[1], 2, 2, 2, 2).mean((3, 5))])


@pytest.mark.parametrize("op,args", [("aten.topk.default", (None, 3, -1)), ("aten.sort.default", (None, -1, True))])
def test_topk_and_sort_keep_their_dim_whole(op, args):
    x = _r(8, 16)
    order = np.argsort(-x, axis=-1, kind="stable")[:, :3 if "topk" in op else 16]
    want = [np.take_along_axis(x, order, -1), order.astype(np.int32)]
    st = _strategies(op, [x], args, want, min_count=3, out_dtypes=["float32", "int64"])
    assert all(p in ("R", ("S", 0)) for s in st for p in s.in_specs[0])

    def fn(s, p):
        v, i = jax.lax.top_k(p, want[0].shape[-1])
        return [v, i]

    check_op(st, [x], want, fn)


def test_one_hot_and_expert_counts():
    ids = rng.integers(0, 6, (8, 4)).astype(np.int32)
    st = _strategies("aten.one_hot.default", [ids], (None, 6), [np.eye(6, dtype=np.int32)[ids]], min_count=6)
    check_op(st, [ids], [np.eye(6, dtype=np.int32)[ids]], lambda s, i: [jax.nn.one_hot(i, 6, dtype=jnp.int32)])
    x = rng.integers(0, 4, (8, 16)).astype(np.float32)
    want = np.histogram(x, bins=4, range=(0, 4))[0].astype(np.float32)
    st = _strategies("aten.histc.default", [x], (None, 4, 0, 4), [want], min_count=6)
    assert any("P" in s.out_specs[0] for s in st)  # a split input counts its part: Partial counts
    check_op(st, [x], [want], lambda s, p: [jnp.zeros(4).at[jnp.clip(p, 0, 3).astype(jnp.int32)].add(1.0)])
    flat = rng.integers(0, 8, 32).astype(np.int32)
    want = np.bincount(flat, minlength=8).astype(np.int32)
    st = _strategies("aten.bincount.default", [flat], (None, None, 8), [want], min_count=3, out_dtypes=["int64"])
    check_op(st, [flat], [want], lambda s, i: [jnp.zeros(8, jnp.int32).at[i].add(1)])


OFFS = np.array([3, 8, 12, 16], np.int32)  # 16 tokens sorted by expert: 3, 5, 4 and 4 per expert


def _groups(rows: jax.Array) -> jax.Array:
    return jnp.searchsorted(jnp.asarray(OFFS), rows, side="right")


def test_grouped_mm_splits_tokens_features_contraction_and_experts():
    a, b = _r(16, 8), _r(4, 8, 8)
    want = torch._grouped_mm(torch.from_numpy(a), torch.from_numpy(b), offs=torch.from_numpy(OFFS)).numpy()
    st = _strategies("aten._grouped_mm.default", [a, b, OFFS], (None, None, None), [want], min_count=12)
    ep = [s for s in st if s.in_specs[1][0] == ("S", 0)]
    st = [s for s in st if s.name in ("s,R", "R,k", "e,R", "R,e", "n,R", "s,e", "e,n", "e,k")]
    assert ep and all(s.out_specs[0][0] == "P" and s.split >= 2 for s in ep)  # expert parallel: Partial rows

    def fwd(s, p, q, offs):
        rows = shard_index(s.in_specs[0], 0) * p.shape[0] + jnp.arange(p.shape[0])
        experts = shard_index(s.in_specs[1], 0) * q.shape[0] + jnp.arange(q.shape[0])
        mask = (_groups(rows)[:, None] == experts[None, :]).astype(p.dtype)
        return [jnp.einsum("se,sk,ekn->sn", mask, p, q)]

    check_op(st, [a, b, OFFS], [want], fwd, rtol=1e-3, atol=1e-3)

    at, g = _r(8, 16), _r(16, 8)  # the weight gradient: [K, S] x [S, N] -> one [K, N] block per expert
    want = torch._grouped_mm(torch.from_numpy(at), torch.from_numpy(g), offs=torch.from_numpy(OFFS)).numpy()
    st = _strategies("aten._grouped_mm.default", [at, g, OFFS], (None, None, None), [want], min_count=12,
                     keep=("e,R", "R,e", "k,R", "R,n", "s,R", "s,e", "e,n"))

    def wgrad(s, p, q, offs):
        rows = shard_index(s.in_specs[0], 1) * p.shape[1] + jnp.arange(p.shape[1])
        n_local = local((4, 8, 8), s.out_specs[0])[0]
        experts = shard_index(s.out_specs[0], 0) * n_local + jnp.arange(n_local)
        mask = (_groups(rows)[:, None] == experts[None, :]).astype(p.dtype)
        return [jnp.einsum("se,ks,sn->ekn", mask, p, q)]

    check_op(st, [at, g, OFFS], [want], wgrad, rtol=1e-3, atol=1e-3)
