"""The plan-quality guard: it speaks when AUTO ties a baseline on several devices and names what forced it."""
from __future__ import annotations

import mesh  # noqa: F401

import warnings

from mesh import Mesh, topology_for

from autoshard.api import solve
from autoshard.graph import Graph, TensorMeta


def _graph(rows: int, opaque: bool) -> Graph:
    """x [rows, 64] -> (an opaque op) -> x @ w -> sum; ``w`` [64, 64] is the only parameter."""
    g = Graph(name=f"guard{rows}{opaque}")
    x = g.add("placeholder", (), (TensorMeta((rows, 64)),), role="input", name="x")
    w = g.add("placeholder", (), (TensorMeta((64, 64)),), role="param", name="w")
    if opaque:
        x = g.add("aten.mystery.default", ((x, 0),), (TensorMeta((rows, 64)),))
    h = g.add("aten.mm.default", ((x, 0), (w, 0)), (TensorMeta((rows, 64)),))
    s = g.add("aten.sum.default", ((h, 0),), (TensorMeta(()),))
    g.outputs = [(s, 0)]
    return g


def _solve(g: Graph, shape: tuple[int, ...]):
    m = Mesh(range(shape[0]), shape, ("data",))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return solve(g, m, topology_for(m, "tpu-v5e"), time_limit=20, cache=False)


def test_an_opaque_op_on_the_batch_is_named_as_what_forced_replication():
    # Hand reasoning: data parallelism must gather x (1 MiB) before the opaque op, far more than the
    # 0.2 us of matmul it would split; replicating x and slicing the opaque op's output for free is cheaper.
    plan = _solve(_graph(4096, opaque=True), (8,))
    guard = plan.stats["guard"]
    assert guard["all_replicated"] and guard["reference"] == "data_parallel" and guard["dp_extra"] > 0
    top = guard["forced_by"][0]
    assert top["op"] == "aten.mystery.default" and "opaque" in top["why"]
    text = plan.explain()
    assert "PLAN QUALITY" in text and "aten.mystery.default" in text


def test_a_data_parallel_plan_is_compared_with_the_best_sharding_baseline():
    big = _solve(_graph(1 << 16, opaque=False), (8,))  # 16 MiB of batch, a 16 KiB weight: data parallel
    guard = big.stats["guard"]
    assert big.placements["x"] == (("S", 0),) and not guard["all_replicated"]
    assert "data_parallel" in guard["ties"] and guard["reference"] not in ("data_parallel", "replicated")
    assert guard["ref_extra"] > 0 and "PLAN QUALITY: no better than" in big.explain()


def test_silent_on_one_device():
    one = _solve(_graph(4096, opaque=True), (1,))
    assert "PLAN QUALITY" not in one.explain() and "forced_by" not in one.stats["guard"]
