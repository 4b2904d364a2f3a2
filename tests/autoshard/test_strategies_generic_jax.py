"""The generic rule's tiers and the pad / fill / scatter-view / index rules, run shard-by-shard on 2x4 vs numpy."""
from __future__ import annotations

from tests.autoshard._shard_check import check_op, local, node_strategies, shard_index  # noqa: I001

import warnings

import jax.numpy as jnp
import numpy as np
import pytest
from mesh import Mesh, topology_for

from autoshard.build import RuleFailedWarning, UnknownOpWarning, build_model
from autoshard.graph import Graph, TensorMeta
from autoshard.strategies.generic import generic_rule

rng = np.random.default_rng(3)


def _r(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


def _check(op, inputs, args, expected, local_fn, min_count, out_dtypes=None):
    strategies, _ = node_strategies(op, inputs, args, [e.shape for e in expected], out_dtypes)
    assert len(strategies) >= min_count, [s.name for s in strategies]
    check_op(strategies, inputs, expected, local_fn)
    return strategies


def _slice_of(full: jnp.ndarray, spec: tuple) -> jnp.ndarray:
    """This device's block of a whole array laid out as ``spec`` (inside shard_map)."""
    for d in range(full.ndim):
        n = full.shape[d] // local(full.shape, spec)[d]
        if n > 1:
            size = full.shape[d] // n
            full = jnp.take(full, shard_index(spec, d) * size + jnp.arange(size), axis=d)
    return full


def test_constant_pad_keeps_the_batch_split_and_the_padded_dim_whole():
    labels = rng.integers(0, 50, (8, 6)).astype(np.int32)
    want = np.pad(labels, ((0, 0), (0, 2)), constant_values=-100)
    st = _check("aten.constant_pad_nd.default", [labels], (None, (0, 2), -100), [want],
                lambda st, x: [jnp.pad(x, ((0, 0), (0, 2)), constant_values=-100)], min_count=3, out_dtypes=["int32"])
    assert all(p in ("R", ("S", 0)) for s in st for p in s.in_specs[0])  # dim 1 is padded: never split
    x = _r(8, 4, 4)  # zero padding of dim 0 only: a linear follower, dims 1 and 2 split
    st = _check("aten.constant_pad_nd.default", [x], (None, (0, 0, 0, 0, 1, 1)), [np.pad(x, ((1, 1), (0, 0), (0, 0)))],
                lambda st, p: [jnp.pad(p, ((1, 1), (0, 0), (0, 0)))], min_count=5)
    assert not any(p == ("S", 0) for s in st for p in s.out_specs[0])


@pytest.mark.parametrize("op,args,fn", [
    ("aten.zero_.default", (None,), lambda x: np.zeros_like(x)),
    ("aten.fill_.Scalar", (None, 1.5), lambda x: np.full_like(x, 1.5)),
    ("aten.masked_fill_.Scalar", (None, None, -1e4), None),
    ("aten.logit.default", (None,), lambda x: np.log(x / (1 - x))),  # generic: torch tags it pointwise
    ("aten.cumsum.default", (None, 1), lambda x: np.cumsum(x, 1)),
    ("aten.flip.default", (None, (0,)), lambda x: x[::-1]),            # generic: same shape, dim 0 whole
])
def test_fill_and_pointwise_and_same_shape_ops(op, args, fn):
    x = np.abs(_r(8, 16)) % 1 * 0.8 + 0.1
    if fn is None:
        mask = _r(8, 16) > 0
        _check(op, [x, mask], args, [np.where(mask, -1e4, x)], lambda st, p, m: [jnp.where(m, -1e4, p)], min_count=6)
        return
    jfn = {"aten.zero_.default": jnp.zeros_like, "aten.fill_.Scalar": lambda p: jnp.full_like(p, 1.5),
           "aten.logit.default": lambda p: jnp.log(p / (1 - p)), "aten.cumsum.default": lambda p: jnp.cumsum(p, 1),
           "aten.flip.default": lambda p: p[::-1]}[op]
    st = _check(op, [x], args, [fn(x)], lambda st, p: [jfn(p)], min_count=3)
    if op in ("aten.cumsum.default", "aten.flip.default"):
        dim = args[1] if isinstance(args[1], int) else args[1][0]
        assert not any(p == ("S", dim) for s in st for p in s.in_specs[0])


def test_new_zeros_reads_no_template_and_costs_no_resharding():
    x = _r(8, 4)
    st = _check("aten.new_zeros.default", [x], (None, (16, 8)), [np.zeros((16, 8), np.float32)],
                lambda st, p: [jnp.zeros(local((16, 8), st.out_specs[0]), jnp.float32)], min_count=6)
    assert {s.out_specs[0] for s in st} >= {("R", "R"), (("S", 0), ("S", 1))}
    g = Graph()
    a = g.add("placeholder", (), (TensorMeta((8, 4)),), role="input", name="x")
    z = g.add("aten.new_zeros.default", ((a, 0),), (TensorMeta((16, 8)),), (None, (16, 8)))
    model = build_model(g, topology_for(Mesh(range(8), (2, 4), ("x", "y")), "tpu-v5e"))
    (mat,) = [m for (u, v), m in zip(model.problem.edges, model.problem.edge_costs) if (u, v) == (a, z)]
    assert not mat.any()  # the template may stay in any layout: it is never gathered


def test_slice_select_and_view_scatter_write_through_views():
    base, src = _r(8, 6), _r(8, 5)
    want = base.copy()
    want[:, 1:] = src
    st = _check("aten.slice_scatter.default", [base, src], (None, None, 1, 1, 6, 1), [want],
                lambda st, b, s: [b.at[:, 1:].set(s)], min_count=3)
    assert not any(p == ("S", 1) for s in st for p in s.out_specs[0])
    col = _r(8)
    want = base.copy()
    want[:, 0] = col
    _check("aten.select_scatter.default", [base, col], (None, None, 1, 0), [want],
           lambda st, b, s: [b.at[:, 0].set(s)], min_count=3)
    chain = (("aten.slice.Tensor", (8, 6), (1, 1, 9223372036854775807)),)  # x[..., 1:] = src, as the lazy core records
    want = base.copy()
    want[:, 1:] = src
    st = _check("view_scatter", [base, src], chain, [want], lambda st, b, s: [b.at[:, 1:].set(s)], min_count=3)
    assert {s.out_specs[0] for s in st} >= {(("S", 0), "R"), ("R", ("S", 0))}
    odd = (("aten.diagonal.default", (8, 6), (0, 0, 1)),)  # a view no rule maps: every dim whole
    st, _ = node_strategies("view_scatter", [base, _r(6)], odd, [base.shape])
    assert [s.out_specs for s in st] == [(("R", "R"),)]


def test_index_put_and_adding_index_ops_leave_partial_positions():
    x, idx, vals = _r(16, 8), rng.permutation(16)[:8].astype(np.int32), _r(8, 8)
    st = _check("aten.index.Tensor", [x, idx], (None, None), [x[idx]], lambda st, a, i: [a[i]], min_count=6)
    assert any(s.in_specs[1][0] == ("S", 0) and s.out_specs[0][0] == ("S", 0) for s in st)  # a gather: rows split
    want = x.copy()
    want[idx] = vals
    _check("aten.index_put.default", [x, idx, vals], (None, None, None, False), [want],
           lambda st, a, i, v: [a.at[i].set(v)], min_count=3)
    tok = rng.integers(0, 16, 12).astype(np.int32)  # an MoE combine: rows added into tokens, duplicates summed
    src = _r(12, 8)
    want = x.copy()
    np.add.at(want, tok, src)
    st = _check("aten.index_add.default", [x, tok, src], (None, 0, None, None), [want],
                lambda st, a, i, s: [a.at[i].add(s)], min_count=6)
    assert any(s.out_specs[0][0] == "P" and s.in_specs[2][0] == ("S", 0) for s in st)
    sidx = rng.integers(0, 16, (12, 8)).astype(np.int32)
    want = x.copy()
    np.add.at(want, (sidx, np.arange(8)[None, :]), src)
    _check("aten.scatter_add.default", [x, sidx, src], (None, 0, None, None), [want],
           lambda st, a, i, s: [a.at[i, jnp.arange(a.shape[1])[None, :]].add(s)], min_count=6)


def test_opaque_op_runs_whole_and_hands_on_slices():
    x = _r(8, 4)
    want = np.tile(x, (1, 2))
    strategies, g = node_strategies("aten.repeat.default", [x], (None, (1, 2)), [want.shape])
    rule, kind = generic_rule(g.nodes[-1], g)
    assert kind == "opaque"
    assert all(s.in_specs == (("R", "R"),) and s.split == 1 for s in strategies)
    check_op(strategies, [x], [want], lambda st, p: [_slice_of(jnp.tile(p, (1, 2)), st.out_specs[0])])


def test_any_op_graph_plans_without_crashing():
    g = Graph()
    empty = g.add("placeholder", (), (TensorMeta((0,)),), role="input", name="cache")  # an empty KV cache
    kv = g.add("placeholder", (), (TensorMeta((8, 2, 4, 8)),), role="input", name="kv")
    cat = g.add("aten.cat.default", ((empty, 0), (kv, 0)), (TensorMeta((8, 2, 4, 8)),), (None, -2))
    top = g.add("aten.topk.default", ((cat, 0),), (TensorMeta((8, 2, 4, 3)), TensorMeta((8, 2, 4, 3), "int64")),
                (None, 3, -1))
    step = g.add("placeholder", (), (TensorMeta((), "int64"),), role="input", name="num_batches_tracked")
    bad = g.add("aten.sum.dim_IntList", ((top, 1), (step, 0)), (TensorMeta((8, 2)),), (None, (2, 3), False))
    g.add("aten.mystery.default", ((bad, 0), (top, 0)), (TensorMeta((3,)), TensorMeta((), "int32")))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = build_model(g, topology_for(Mesh(range(8), (2, 4), ("x", "y")), "tpu-v5e"))
    kinds = {(w.category, str(w.message).split("'")[1]) for w in caught if issubclass(w.category, UnknownOpWarning)}
    assert kinds == {(RuleFailedWarning, "aten.sum.dim_IntList"), (UnknownOpWarning, "aten.mystery.default")}
    assert sorted(set(model.unknown_ops)) == ["aten.mystery.default", "aten.sum.dim_IntList"]
    assert any(s.out_specs[0][0] == ("S", 0) for s in model.strategies[cat])  # the cache cat keeps the batch split
    assert all(s.out_specs == (("R", "R"),) for s in model.strategies[step])  # 0-d: replicated only
