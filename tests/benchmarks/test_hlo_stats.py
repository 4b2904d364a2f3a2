"""benchmarks/_hlo_stats.py: collective bytes and memory read from real JAX executables.

Oracle: programs whose partitioned collectives are known by construction (a sharded
vector gathered to every device; a sum over a sharded axis) and numpy byte counts.
"""
from __future__ import annotations

import mesh  # noqa: F401  (8 virtual devices before jax)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from benchmarks._hlo_stats import collective_stats, memory_bytes, time_executable
from mesh import Mesh


def _compiled(fn, x, out_spec):
    m = Mesh(range(8), (8,), ("d",)).jax_mesh()
    arr = jax.device_put(x, NamedSharding(m, P("d")))
    return jax.jit(fn, out_shardings=NamedSharding(m, out_spec)).lower(arr).compile(), arr


def test_all_gather_bytes() -> None:
    x = np.arange(1024, dtype=np.float32)
    compiled, _ = _compiled(lambda a: a * 2, x, P())
    s = collective_stats(compiled.as_text())
    assert s["all-gather"].count >= 1
    assert s["all-gather"].result_bytes == x.nbytes * s["all-gather"].count
    assert s["all-gather"].operand_bytes == x.nbytes // 8 * s["all-gather"].count
    assert s["all-reduce"].count == 0


def test_all_reduce_of_a_sum() -> None:
    x = np.ones((64, 16), dtype=np.float32)
    compiled, arr = _compiled(lambda a: jnp.sum(a, axis=0), x, P())
    s = collective_stats(compiled.as_text())
    assert s["all-reduce"].count == 1
    assert s["all-reduce"].result_bytes == 16 * 4
    mem = memory_bytes(compiled)
    assert mem["argument"] == x.nbytes // 8  # per device: one shard of the input
    assert mem["output"] == 16 * 4
    assert len(time_executable(compiled, 2)) == 2
    np.testing.assert_allclose(np.asarray(compiled(arr)), x.sum(0))
