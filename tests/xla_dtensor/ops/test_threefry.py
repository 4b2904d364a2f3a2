"""``xla_dtensor.ops.threefry`` against ``jax.random`` (the oracle for the bits) and XLA's own
memory analysis (the reason it exists: no temporaries beyond the output)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

import xla_dtensor  # noqa: F401  (enables x64, as the library runs)
from xla_dtensor.ops import threefry

KEY = np.array([123, 456789], np.uint32)


@pytest.mark.parametrize("shape", [(), (1,), (5, 7), (2, 3, 4)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_values_equal_jax_random(shape: tuple, dtype: object) -> None:
    u = jax.jit(lambda k: threefry.uniform(k, shape, dtype, -2.0, 3.0))(KEY)
    np.testing.assert_array_equal(np.asarray(u), np.asarray(jax.random.uniform(KEY, shape, dtype, -2.0, 3.0)))
    n = jax.jit(lambda k: threefry.normal(k, shape, dtype))(KEY)
    np.testing.assert_array_equal(np.asarray(n), np.asarray(jax.random.normal(KEY, shape, dtype)))
    b = threefry.random_bits(KEY, shape, 32)
    np.testing.assert_array_equal(np.asarray(b), np.asarray(jax.random.bits(KEY, shape, jnp.uint32)))


def test_typed_key_and_wide_counters() -> None:
    typed = jax.random.key(5)
    np.testing.assert_array_equal(np.asarray(threefry.uniform(typed, (9,), jnp.float32)),
                                  np.asarray(jax.random.uniform(typed, (9,), jnp.float32)))
    # the 64-bit index path (used from 2**32 elements) gives the same words on a small shape
    for a, b in zip(threefry._counters((3, 5, 7), True), threefry._counters((3, 5, 7), False)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert int(threefry._counters((3, 5, 7), True)[1][2, 4, 6]) == 3 * 5 * 7 - 1
    with pytest.raises(ValueError, match="threefry key"):
        threefry.uniform(np.zeros(4, np.uint32), (2,))


def test_sharded_uniform_needs_no_temporaries() -> None:
    """A sharded 2048x2048 uniform: jax.random's CPU lowering (a rolled loop) holds full-size
    uint32 temporaries; ours is one fusion writing the output (XLA's memory analysis)."""
    mesh = jax.make_mesh((8,), ("x",))
    out = NamedSharding(mesh, PartitionSpec("x", None))
    shape = (2048, 2048)
    ours = jax.jit(lambda k: threefry.uniform(k, shape, jnp.float32), out_shardings=out).lower(KEY).compile()
    theirs = jax.jit(lambda k: jax.random.uniform(k, shape, jnp.float32), out_shardings=out).lower(KEY).compile()
    shard = 2048 * 2048 * 4 // 8
    assert ours.memory_analysis().temp_size_in_bytes < 1024
    assert theirs.memory_analysis().temp_size_in_bytes >= shard  # NOTE: the control (6 shards measured on CPU)
