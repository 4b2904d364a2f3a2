"""The cost model's collective rules, checked against what XLA's partitioner emits.

Oracle: the compiled, partitioned HLO of small jax programs on the 8 virtual devices
(count of collectives; on the virtual CPU devices each one pays the per-collective
latency the ``cpu`` preset measures).
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (8 virtual devices before jax)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from autoshard.cost import reshard_cost
from autoshard.graph import TensorMeta
from mesh import Mesh, topology_for

_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def _collectives(text: str) -> int:
    return sum(line.count(f" {k}(") + line.count(f" {k}-start(") for line in text.splitlines() for k in _KINDS)


def _row_parallel(bias_spec: P, mesh_shape: tuple[int, ...], axes: tuple[str, ...], k_spec) -> int:
    """Collectives of ``x @ w + b`` with the contraction dim split and a replicated result."""
    m = Mesh(range(8), mesh_shape, axes).jax_mesh()
    x = jax.device_put(np.ones((16, 64), np.float32), NamedSharding(m, P(None, k_spec)))
    w = jax.device_put(np.ones((64, 32), np.float32), NamedSharding(m, P(k_spec, None)))
    b = jax.device_put(np.ones((32,), np.float32), NamedSharding(m, bias_spec))
    fn = jax.jit(lambda x, w, b: jnp.tanh(x @ w + b), out_shardings=NamedSharding(m, P()))
    return _collectives(fn.lower(x, w, b).compile().as_text())


def test_sharded_bias_of_a_partial_matmul_costs_a_collective_a_replicated_one_does_not():
    replicated = _row_parallel(P(), (8,), ("d",), "d")
    sharded = _row_parallel(P("d"), (8,), ("d",), "d")
    assert replicated == 1          # the partial sum's all-reduce only
    assert sharded > replicated     # XLA has no local shard -> partial: the bias costs its own collective
    topo = topology_for(Mesh(range(8), (8,), ("d",)), "cpu")
    bias = TensorMeta((32,), "float32")
    assert reshard_cost(("R",), ("P",), bias, topo) == 0.0
    assert reshard_cost((("S", 0),), ("P",), bias, topo) >= topo.links[0].alpha


def test_a_partial_sum_over_both_axes_of_a_2x4_mesh_is_reduced_by_one_collective():
    # the contraction dim split over both mesh axes: XLA issues a single all-reduce over all 8 devices
    assert _row_parallel(P(), (2, 4), ("a", "b"), ("a", "b")) == 1
    topo = topology_for(Mesh(range(8), (2, 4), ("a", "b")), "cpu")
    t = TensorMeta((16, 32), "float32")
    assert reshard_cost(("P", "P"), ("R", "R"), t, topo) == topo.all_reduce(t.nbytes, (0, 1))
    assert reshard_cost(("P", "P"), ("R", "R"), t, topo) < topo.all_reduce(t.nbytes, 0) + topo.all_reduce(t.nbytes, 1)
