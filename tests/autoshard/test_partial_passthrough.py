"""Partial values through sums and an embedding backward: strategies checked by JAX, costs by hand.

Oracles: ``shard_map`` runs of each strategy against numpy (a ``P`` input is held by one
device of the axis, a ``P`` output is summed over it), and the alpha-beta formulas of
the ``cpu`` preset worked out by hand for the reductions a tied embedding's gradient needs.
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (virtual devices before JAX)

import math

import jax.numpy as jnp
import numpy as np
import pytest

from autoshard.build import build_model
from autoshard.fold import fold_ties
from autoshard.graph import Graph, TensorMeta
from autoshard.solver import solve_problem
from autoshard.strategies import follow_strategies, rule_for
from mesh import Mesh, topology_for
from tests.autoshard._shard_check import SIZES, check_op, node_strategies

rng = np.random.default_rng(7)


def _r(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _follower(op, inputs, leader_specs, args=()):
    g = Graph()
    refs = [(g.add("placeholder", (), (TensorMeta(a.shape),), role="input", name=f"a{i}"), 0)
            for i, a in enumerate(inputs)]
    out = np.broadcast_shapes(*(a.shape for a in inputs))
    nid = g.add(op, tuple(refs), (TensorMeta(tuple(out)),), args)
    rule = rule_for(g.nodes[nid], g)
    metas = [TensorMeta(a.shape) for a in inputs]
    return follow_strategies(rule, leader_specs, metas, g.nodes[nid].outputs, SIZES)


@pytest.mark.parametrize("op,fn", [("aten.add.Tensor", np.add), ("aten.sub.Tensor", np.subtract)])
def test_a_sum_of_partial_tensors_stays_partial(op, fn):
    a, b = _r(8, 16), _r(8, 16)
    leaders = [("P", "P"), ("P", ("S", 0)), (("S", 1), "P"), ("R", "R")]
    strategies = _follower(op, [a, b], leaders)
    assert strategies[0].in_specs == (("P", "P"), ("P", "P")) and strategies[0].out_specs == (("P", "P"),)
    assert strategies[1].in_specs[1] == ("P", ("S", 0))
    assert all(st.split == math.prod(n for p, n in zip(st.out_specs[0], SIZES) if p != "P" and p != "R")
               for st in strategies)  # a partial axis does not divide the work
    assert check_op(strategies, [a, b], [fn(a, b)], lambda st, x, y: [x + y if op.startswith("aten.add") else x - y]) == 4


def test_a_broadcast_bias_added_to_a_partial_value_is_held_by_one_device():
    x, bias = _r(8, 16), _r(16)
    (st,) = _follower("aten.add.Tensor", [x, bias], [("P", ("S", 0))])
    assert st.in_specs == (("P", ("S", 0)), ("P", "R")) and st.out_specs == (("P", ("S", 0)),)
    check_op([st], [x, bias], [x + bias], lambda s, p, q: [p + q])


def test_affine_and_in_place_adds_still_reduce_a_partial_leader_first():
    x = _r(8, 16)
    # x + 2 (a scalar operand): adding it on every device would count it 8 times
    (st,) = _follower("aten.add.Tensor", [x], [("P", "P")], args=(None, 2.0))
    assert "P" not in st.in_specs[0] + st.out_specs[0]
    check_op([st], [x], [x + 2.0], lambda s, p: [p + 2.0])
    (st,) = _follower("aten.add_.Tensor", [x, _r(8, 16)], [("P", "P")])
    assert "P" not in st.out_specs[0]


def test_embedding_backward_passes_a_partial_gradient_through():
    grad, ids = _r(8, 4, 8), rng.integers(0, 16, (8, 4)).astype(np.int32)
    dw = np.zeros((16, 8), np.float32)
    np.add.at(dw, ids, grad)
    strategies, _ = node_strategies("aten.embedding_dense_backward.default", [grad, ids], (None, None, 16, -1, False),
                                    [(16, 8)])
    through = [st for st in strategies if "P" in st.in_specs[0]]
    # per axis R, b0, b1, h, v (all divide here) or P: the 6 * 6 - 5 * 5 assignments with a P
    assert len(through) == 11
    assert all(st.in_specs[1][a] == "R" for st in through for a, p in enumerate(st.in_specs[0]) if p == "P")
    assert all(st.out_specs[0][a] == "P" for st in through for a, p in enumerate(st.in_specs[0]) if p == "P")
    full = next(st for st in through if st.in_specs[0] == ("P", "P"))
    assert full.split == 1

    def backward(st, g, i):
        return [jnp.zeros((16, g.shape[-1]), g.dtype).at[i.reshape(-1)].add(g.reshape(-1, g.shape[-1]))]

    check_op([st for st in through if all(p in ("P", "R") for p in st.out_specs[0])], [grad, ids], [dw], backward)


# -- costs: the gradient of a tied embedding, and of a position embedding ----------------
V, H, B, S = 32, 8, 16, 4


def _tied_embedding_step() -> tuple[Graph, int]:
    """grad(w) = hidden^T @ dlogits (output projection) + embedding_backward(dx, ids); then w -= grad."""
    g = Graph()
    f32 = lambda *s: (TensorMeta(s),)  # noqa: E731
    w = g.add("placeholder", (), f32(V, H), role="param", name="w")
    ids = g.add("placeholder", (), (TensorMeta((B, S), "int64"),), role="input", name="ids")
    dlogits_t = g.add("placeholder", (), f32(V, B * S), role="input", name="dlogits_t")
    hidden = g.add("placeholder", (), f32(B * S, H), role="input", name="hidden")
    dx = g.add("placeholder", (), f32(B, S, H), role="input", name="dx")
    proj = g.add("aten.mm.default", ((dlogits_t, 0), (hidden, 0)), f32(V, H))
    emb = g.add("aten.embedding_dense_backward.default", ((dx, 0), (ids, 0)), f32(V, H), (None, None, V, -1, False))
    grad = g.add("aten.add.Tensor", ((proj, 0), (emb, 0)), f32(V, H), role="grad")
    upd = g.add("aten.sub_.Tensor", ((w, 0), (grad, 0)), f32(V, H))
    g.alias_groups = [[w, upd]]
    g.grads = {w: (grad, 0)}
    return g, grad


def _position_embedding_step() -> Graph:
    """grad(wpe) = embedding_backward(sum over the batch of dx, positions)."""
    g = Graph()
    w = g.add("placeholder", (), (TensorMeta((S, H)),), role="param", name="wpe")
    pos = g.add("placeholder", (), (TensorMeta((S,), "int64"),), role="constant", name="pos")
    dx = g.add("placeholder", (), (TensorMeta((B, S, H)),), role="input", name="dx")
    summed = g.add("aten.sum.dim_IntList", ((dx, 0),), (TensorMeta((S, H)),), (None, (0,), False))
    grad = g.add("aten.embedding_dense_backward.default", ((summed, 0), (pos, 0)), (TensorMeta((S, H)),),
                 (None, None, S, -1, False), role="grad")
    upd = g.add("aten.sub_.Tensor", ((w, 0), (grad, 0)), (TensorMeta((S, H)),))
    g.alias_groups = [[w, upd]]
    g.grads = {w: (grad, 0)}
    return g


def _edge_seconds(g: Graph, pinned: dict) -> tuple[float, list]:
    topo = topology_for(Mesh(range(8), (8,), ("d",)), "cpu")
    model = build_model(g, topo, pinned=pinned)
    folded = fold_ties(model.problem, model.ties)
    s = folded.expand(solve_problem(folded.problem, 30).strategies)
    p = model.problem
    comm = sum(float(np.asarray(c)[s[u], s[v]]) for (u, v), c in zip(p.edges, p.edge_costs))
    return comm, [model.strategies[v][s[v]] for v in range(g.num_nodes)]


def test_a_tied_embedding_gradient_is_reduced_once_as_a_gradient():
    g, grad = _tied_embedding_step()
    batch = (("S", 0),)
    comm, chosen = _edge_seconds(g, {"w": ("R",), "ids": batch, "dx": batch, "hidden": batch,
                                     "dlogits_t": (("S", 1),)})
    beta = 1 / 1.8e9  # the cpu preset's host link; gradient reductions are combined: no latency
    assert comm == pytest.approx(2 * beta * 7 / 8 * V * H * 4, rel=1e-9)
    assert chosen[grad].out_specs == (("P",),)


def test_a_position_embedding_gradient_is_reduced_after_its_backward():
    g = _position_embedding_step()
    comm, chosen = _edge_seconds(g, {"wpe": ("R",), "dx": (("S", 0),)})
    beta = 1 / 1.8e9
    assert comm == pytest.approx(2 * beta * 7 / 8 * S * H * 4, rel=1e-9)
    assert chosen[4].in_specs[0] == ("P",) and chosen[4].out_specs == (("P",),)


@pytest.mark.parametrize("op,fn", [("aten.ones_like.default", jnp.ones_like), ("aten.full_like.default",
                                                                               lambda t: jnp.full_like(t, 3.0))])
def test_a_like_op_reads_a_partial_leader_without_reducing_it(op, fn):
    """``ones_like(loss)`` of a Partial loss needs no all-reduce: only the shape is read."""
    x = _r(8, 16)
    leaders = [("P", "P"), ("P", ("S", 0)), (("S", 1), "P"), ("R", "R")]
    strategies = _follower(op, [x], leaders, args=(None, 3.0) if "full" in op else ())
    assert [st.in_specs[0] for st in strategies] == leaders  # the leader as it is: no reshard edge
    assert [st.out_specs[0] for st in strategies] == [("R", "R"), ("R", ("S", 0)), (("S", 1), "R"), ("R", "R")]
    assert check_op(strategies, [x], [np.asarray(fn(x))], lambda st, p: [fn(p)]) == 4
