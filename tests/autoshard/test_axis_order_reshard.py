"""A dim split over several mesh axes keeps a device's shard only along a common axis prefix.

Oracle: the compiled, partitioned HLO of a jax reshard (``with_sharding_constraint``
from one layout to another) on the 2x4 virtual mesh: whether XLA moves any data, and
how many bytes its all-gathers produce. The cost model must charge a reshard exactly
when XLA communicates: before the rule, ``S(0)S(0) -> RS(0)`` (dim 0 over (a, b) ->
over b) was priced as an all-gather over ``a`` alone, and ``RS(0) -> S(0)S(0)`` as
free; XLA gathers the whole dim (or permutes) for both.
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (8 virtual devices before jax)

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from autoshard.cost import reshard_cost
from autoshard.graph import TensorMeta
from mesh import Mesh, topology_for

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_MESH = Mesh(range(8), (2, 4), ("a", "b"))
_SHAPE = (16, 32)


def _pspec(spec: tuple) -> P:
    """autoshard spec (per mesh axis) -> PartitionSpec with each dim's axes in mesh order."""
    dims: list[list[str]] = [[] for _ in _SHAPE]
    for axis, p in zip(("a", "b"), spec):
        if isinstance(p, tuple):
            dims[p[1]].append(axis)
    return P(*(tuple(d) if len(d) > 1 else (d[0] if d else None) for d in dims))


def _xla_collectives(src: tuple, dst: tuple) -> int:
    m = _MESH.jax_mesh()
    x = jax.device_put(np.arange(np.prod(_SHAPE), dtype=np.float32).reshape(_SHAPE), NamedSharding(m, _pspec(src)))
    fn = jax.jit(lambda v: v * 2.0, out_shardings=NamedSharding(m, _pspec(dst)))
    text = fn.lower(x).compile().as_text()
    out = fn(x)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x) * 2.0)
    return sum(line.count(f" {k}(") + line.count(f" {k}-start(") for line in text.splitlines() for k in _KINDS)


S0 = ("S", 0)
CASES = [
    ((S0, S0), ("R", S0)),      # drop the major axis, keep the minor: not a slice
    (("R", S0), (S0, S0)),      # add a major axis before a kept one: not a slice
    ((S0, S0), (S0, "R")),      # drop the minor axis: a plain all-gather over b
    ((S0, "R"), (S0, S0)),      # add a minor axis: a local slice
    ((S0, S0), ("R", "R")),
    (("R", "R"), (S0, S0)),
    ((S0, S0), (S0, S0)),
]


@pytest.mark.parametrize("src,dst", CASES, ids=[f"{s}->{d}" for s, d in CASES])
def test_reshard_is_charged_exactly_when_xla_communicates(src, dst):
    topo = topology_for(_MESH, "cpu")
    cost = reshard_cost(src, dst, TensorMeta(_SHAPE, "float32"), topo)
    assert (cost > 0) == (_xla_collectives(src, dst) > 0)


def test_dropping_the_major_axis_costs_a_gather_over_both_axes():
    topo = topology_for(_MESH, "cpu")
    t = TensorMeta(_SHAPE, "float32")
    major = reshard_cost((S0, S0), ("R", S0), t, topo)
    minor = reshard_cost((S0, S0), (S0, "R"), t, topo)
    assert major == pytest.approx(topo.all_gather(t.nbytes, (0, 1)))
    assert major > minor > 0
