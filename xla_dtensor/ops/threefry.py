"""Threefry-2x32 random bits as plain elementwise ops, so XLA fuses them into their consumer.

Why not ``jax.random.uniform``: on CPU, JAX lowers its ``threefry2x32`` primitive as a rolled
``fori_loop`` (5 iterations of 4 rounds). A loop is never fused, so every random tensor
materializes its counters and both threefry words as full-size ``uint32`` buffers, plus the
loop's copies: measured 6 shard-sized temporaries per parameter for ``reset_parameters()`` of a
sharded 2048x2048 weight (host peak of ``to_empty`` + random init 3.15x the model's bytes).
Written out (20 rounds unrolled) the counters (iotas), the rounds, the xor and the bits-to-float
conversion are one loop fusion writing the output directly: no temporaries, and faster to
compile than the loop.

The bits are the ones ``jax.random`` draws for a raw ``uint32[2]`` threefry key under
``jax_threefry_partitionable`` (JAX's default): the 64-bit row-major element index is the
counter, split into a high and a low word, and the two output words are xored (32 bits) or
concatenated (64 bits). So the values do not depend on how the output is sharded, and equal
``jax.random.uniform`` / ``jax.random.normal`` for the same key (tests/xla_dtensor/ops).

Threefry-2x32 with 20 rounds: Salmon et al., "Parallel random numbers: as easy as 1, 2, 3"
(SC 2011), rotation constants and key-schedule parity from the paper.

Example:
    >>> import numpy as np
    >>> uniform(np.array([0, 7], np.uint32), (2, 3), np.float32).shape
    (2, 3)
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))
_PARITY = np.uint32(0x1BD11BDA)


def _rotl(x: jax.Array, d: int) -> jax.Array:
    return (x << np.uint32(d)) | (x >> np.uint32(32 - d))


def threefry2x32(k0: Any, k1: Any, c0: jax.Array, c1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The Threefry-2x32 block function (20 rounds) of counters ``(c0, c1)`` under key ``(k0, k1)``."""
    ks = (k0, k1, k0 ^ k1 ^ _PARITY)
    x0, x1 = c0 + ks[0], c1 + ks[1]
    for i in range(5):
        for r in _ROTATIONS[i % 2]:
            x0 = x0 + x1
            x1 = _rotl(x1, r) ^ x0
        x0 = x0 + ks[(i + 1) % 3]
        x1 = x1 + ks[(i + 2) % 3] + np.uint32(i + 1)
    return x0, x1


def _counters(shape: tuple[int, ...], wide: bool) -> tuple[jax.Array, jax.Array]:
    """The (high, low) 32-bit words of each element's row-major index, built from iotas."""
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    if not wide:  # NOTE: fewer than 2**32 elements: the high word is 0, the index fits uint32
        lo = sum((jax.lax.broadcasted_iota(jnp.uint32, shape, d) * np.uint32(s)
                  for d, s in enumerate(strides)), jnp.zeros(shape, jnp.uint32))
        return jnp.zeros(shape, jnp.uint32), lo
    idx = sum((jax.lax.broadcasted_iota(jnp.uint64, shape, d) * np.uint64(s)
               for d, s in enumerate(strides)), jnp.zeros(shape, jnp.uint64))
    return (idx >> np.uint64(32)).astype(jnp.uint32), (idx & np.uint64(0xFFFFFFFF)).astype(jnp.uint32)


def _key_words(key: Any) -> tuple[jax.Array, jax.Array]:
    key = jnp.asarray(key)
    if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if key.shape != (2,) or key.dtype != jnp.uint32:
        raise ValueError(f"expected a threefry key: uint32[2] or a typed threefry key, got {key.dtype}{list(key.shape)}")
    return key[0], key[1]


def random_bits(key: Any, shape: Sequence[int], bits: int = 32) -> jax.Array:
    """Uniform random ``uint32`` (``bits=32``) or ``uint64`` (``bits=64``) of ``shape``.

    Example:
        >>> random_bits(np.array([0, 1], np.uint32), (4,)).dtype
        dtype('uint32')
    """
    shape = tuple(int(s) for s in shape)
    k0, k1 = _key_words(key)
    hi, lo = threefry2x32(k0, k1, *_counters(shape, wide=math.prod(shape) >= 2 ** 32))
    if bits == 32:
        return hi ^ lo
    if bits == 64:
        return (hi.astype(jnp.uint64) << np.uint64(32)) | lo.astype(jnp.uint64)
    raise ValueError(f"random_bits: bits must be 32 or 64, got {bits}")


def uniform(key: Any, shape: Sequence[int], dtype: Any = jnp.float32, low: Any = 0.0, high: Any = 1.0) -> jax.Array:
    """Uniform floats in ``[low, high)`` (``dtype`` float32 or float64), as ``jax.random.uniform``.

    The top mantissa-many bits become the mantissa of a float in [1, 2); minus 1 is [0, 1).

    Example:
        >>> u = uniform(np.array([0, 1], np.uint32), (1000,), np.float32, -2.0, 2.0)
        >>> bool((u >= -2).all() and (u < 2).all())
        True
    """
    dtype = jnp.dtype(dtype)
    if dtype not in (jnp.float32, jnp.float64):
        raise ValueError(f"uniform: dtype must be float32 or float64, got {dtype}")
    width = dtype.itemsize * 8
    uint = jnp.uint32 if width == 32 else jnp.uint64
    mant = jnp.finfo(dtype).nmant
    one = np.array(1.0, dtype).view(uint)
    raw = random_bits(key, shape, width)
    floats = jax.lax.bitcast_convert_type((raw >> uint(width - mant)) | one, dtype) - np.array(1.0, dtype)
    low, high = jnp.asarray(low, dtype), jnp.asarray(high, dtype)
    return jnp.maximum(low, floats * (high - low) + low)


def normal(key: Any, shape: Sequence[int], dtype: Any = jnp.float32) -> jax.Array:
    """Standard normal floats by the inverse CDF, ``sqrt(2) erfinv(u)`` for ``u`` uniform in (-1, 1),
    as ``jax.random.normal``.

    Example:
        >>> normal(np.array([0, 1], np.uint32), (2, 2)).shape
        (2, 2)
    """
    dtype = jnp.dtype(dtype)
    low = np.nextafter(np.array(-1.0, dtype), np.array(0.0, dtype), dtype=dtype)
    u = uniform(key, shape, dtype, low, 1.0)
    return np.array(np.sqrt(2), dtype) * jax.lax.erf_inv(u)
