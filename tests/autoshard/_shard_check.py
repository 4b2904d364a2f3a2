"""Run every strategy of one op with JAX ``shard_map`` on a 2x4 mesh and compare with numpy.

A strategy claims: if each device holds its shard of the inputs (``P`` inputs: device 0
of that axis holds the value, the others zeros), running the op on local shards gives
its shard of the outputs (``P`` outputs: summing over the axis gives the value). The
local op is the same jnp function with local shape arguments; all strategies of one
op are checked in one jit (one compile).
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (sets up 8 virtual CPU devices before JAX starts)

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from autoshard.graph import Graph, TensorMeta
from autoshard.spec import Spec, dim_factor, is_shard, local_shape, partition_spec
from autoshard.strategies import Strategy, enumerate_strategies
from autoshard.strategies.generic import resolve

AXES = ("x", "y")
SIZES = (2, 4)


def jax_mesh() -> jax.sharding.Mesh:
    return _mesh.Mesh(range(8), SIZES, AXES).jax_mesh()


def node_strategies(op: str, inputs: Sequence[np.ndarray], args: tuple, outs: Sequence[tuple[int, ...]],
                    out_dtypes: Sequence[str] | None = None) -> tuple[list[Strategy], Graph]:
    """Build a one-op graph (placeholders + the op) and enumerate its rule over the 2x4 mesh."""
    g = Graph()
    refs = [(g.add("placeholder", (), (TensorMeta(a.shape, str(a.dtype)),), role="input", name=f"a{i}"), 0)
            for i, a in enumerate(inputs)]
    dtypes = out_dtypes or ["float32"] * len(outs)
    nid = g.add(op, tuple(refs), tuple(TensorMeta(tuple(s), d) for s, d in zip(outs, dtypes)), args)
    rule, _ = resolve(g.nodes[nid], g)  # a registered rule, else the generic one
    metas = [TensorMeta(a.shape, str(a.dtype)) for a in inputs]
    return enumerate_strategies(rule, metas, g.nodes[nid].outputs, SIZES), g


def shard_index(spec: Spec, dim: int) -> jax.Array:
    """This device's block index along tensor dim ``dim`` (major axis first), inside shard_map."""
    idx = jnp.int32(0)
    for p, name, n in zip(spec, AXES, SIZES):
        if is_shard(p) and p[1] == dim:
            idx = idx * n + jax.lax.axis_index(name)
    return idx


def check_op(strategies: Sequence[Strategy], inputs: Sequence[np.ndarray], expected: Sequence[np.ndarray],
             local_fn: Callable[..., Sequence[jax.Array]], rtol: float = 1e-4, atol: float = 1e-4) -> int:
    """Assert every strategy reproduces ``expected``; ``local_fn(strategy, *shards)`` runs the op locally.

    Returns how many strategies were checked.
    """
    jm = jax_mesh()

    def one(st: Strategy) -> Callable:
        in_ps = [PartitionSpec(*partition_spec(s, AXES, a.ndim)) for s, a in zip(st.in_specs, inputs)]
        out_ps = [PartitionSpec(*partition_spec(s, AXES, e.ndim)) for s, e in zip(st.out_specs, expected)]

        def body(*xs: jax.Array) -> tuple:
            xs = [_partial_in(x, s) for x, s in zip(xs, st.in_specs)]
            outs = local_fn(st, *xs)
            return tuple(_partial_out(o, s) for o, s in zip(outs, st.out_specs))

        return jax.shard_map(body, mesh=jm, in_specs=tuple(in_ps), out_specs=tuple(out_ps), check_vma=False)

    fns = [one(st) for st in strategies]
    results = jax.jit(lambda *xs: [f(*xs) for f in fns])(*[jnp.asarray(a) for a in inputs])
    for st, outs in zip(strategies, results):
        for j, (got, want) in enumerate(zip(outs, expected)):
            np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=atol,
                                       err_msg=f"strategy {st.name} output {j} specs {st.out_specs[j]}")
    return len(strategies)


def _partial_in(x: jax.Array, spec: Spec) -> jax.Array:
    for p, name in zip(spec, AXES):
        if p == "P":
            x = jnp.where(jax.lax.axis_index(name) == 0, x, jnp.zeros_like(x))
    return x


def _partial_out(x: jax.Array, spec: Spec) -> jax.Array:
    names = tuple(name for p, name in zip(spec, AXES) if p == "P")
    return jax.lax.psum(x, names) if names else x


def local(shape: Sequence[int], spec: Spec) -> tuple[int, ...]:
    return local_shape(shape, spec, SIZES)


def factor(spec: Spec, dim: int) -> int:
    return dim_factor(spec, dim, SIZES)
