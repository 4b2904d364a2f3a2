"""Random-number lowerings and the torch-compatible seed API they draw keys from.

Convention (see ``registry``): random lowerings are registered with
``@lowering(op, random=True)`` and take a JAX PRNG key as an extra first argument;
``generator=`` keywords are ignored. The lazy core draws one key per random node with
``next_key()`` and feeds it as graph input *data*, so replaying a graph never
recompiles. Streams are reproducible under ``manual_seed`` but are not bit-equal to
torch's CPU generator (Mersenne twister / Philox); only the distributions match.

Example:
    >>> import torch
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> _ = manual_seed(0)
    >>> get_lowering(torch.ops.aten.rand.default)(next_key(), [2, 3]).shape
    (2, 3)
"""
from __future__ import annotations

import os
import struct
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.dtypes import cast, default_float, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering
from xla_dtensor.ops import threefry

aten = torch.ops.aten
_MASK32 = 0xFFFFFFFF


class Generator:
    """A seed and a counter; each ``next_key()`` is a distinct threefry key (seed, offset).

    Example:
        >>> g = Generator(7)
        >>> (g.next_key() != g.next_key()).any()
        True
    """

    __slots__ = ("_seed", "_offset")

    def __init__(self, seed: int = 67280421310721) -> None:  # torch's default CPU seed
        self.manual_seed(seed)

    def manual_seed(self, seed: int) -> Generator:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
        self._seed, self._offset = seed & 0xFFFFFFFFFFFFFFFF, 0
        return self

    def initial_seed(self) -> int:
        return self._seed

    def next_key(self) -> np.ndarray:
        """A legacy ``uint32[2]`` threefry key (host array; cheap) for the next random node."""
        hi, lo = self._seed >> 32, self._seed & _MASK32
        mixed = (lo ^ (hi * 0x9E3779B1) ^ ((self._offset >> 32) * 0x85EBCA77)) & _MASK32
        key = np.array([mixed, self._offset & _MASK32], dtype=np.uint32)
        self._offset += 1
        return key

    def get_state(self) -> torch.Tensor:
        """16 bytes (seed, offset) as a uint8 tensor, like ``torch.get_rng_state()``."""
        return torch.frombuffer(bytearray(struct.pack("<QQ", self._seed, self._offset)), dtype=torch.uint8)

    def set_state(self, state: torch.Tensor) -> None:
        data = bytes(state.to(torch.uint8).tolist())
        if len(data) != 16:
            raise ValueError(f"rng state must have 16 bytes (seed, offset), got {len(data)}")
        self._seed, self._offset = struct.unpack("<QQ", data)


default_generator = Generator()


def manual_seed(seed: int) -> Generator:
    """Seed the default generator (``xla_dtensor.manual_seed``). Returns it."""
    return default_generator.manual_seed(int(seed))


def seed() -> int:
    """Seed the default generator from OS entropy; return the seed."""
    s = int.from_bytes(os.urandom(8), "little") >> 1
    default_generator.manual_seed(s)
    return s


def initial_seed() -> int:
    """The default generator's seed."""
    return default_generator.initial_seed()


def next_key() -> np.ndarray:
    """The default generator's next key."""
    return default_generator.next_key()


def get_rng_state() -> torch.Tensor:
    """The default generator's state."""
    return default_generator.get_state()


def set_rng_state(state: torch.Tensor) -> None:
    """Restore a state from ``get_rng_state``."""
    default_generator.set_state(state)


def _float(dtype: torch.dtype | None) -> Any:
    return to_jax(dtype or default_float())


def _uniform(key: Any, shape: Sequence[int], dt: Any, low: Any = 0.0, high: Any = 1.0) -> jax.Array:
    gen = dt if dt in (jnp.float32, jnp.float64) else jnp.float32
    return threefry.uniform(key, tuple(shape), gen, low, high).astype(dt)


@lowering(aten.rand.default, aten.rand.generator, random=True)
def _rand(key: Any, size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _uniform(key, size, _float(dtype))


@lowering(aten.randn.default, aten.randn.generator, random=True)
def _randn(key: Any, size: Sequence[int], *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    dt = _float(dtype)
    return threefry.normal(key, tuple(size), dt if dt in (jnp.float32, jnp.float64) else jnp.float32).astype(dt)


@lowering(aten.rand_like.default, random=True)
def _rand_like(key: Any, x: jax.Array, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _uniform(key, x.shape, to_jax(dtype or torch_dtype(x)))


@lowering(aten.randn_like.default, random=True)
def _randn_like(key: Any, x: jax.Array, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _randn(key, x.shape, dtype=dtype or torch_dtype(x))


def _randint(key: Any, low: int, high: int, shape: Sequence[int], dt: Any) -> jax.Array:
    if high <= low:
        raise ValueError(f"randint: need low < high, got low={low}, high={high}")
    return jax.random.randint(key, tuple(shape), low, high, jnp.int64).astype(dt)


@lowering(aten.randint.default, aten.randint.generator, random=True)
def _randint_high(key: Any, high: int, size: Sequence[int], *, dtype: torch.dtype | None = None,
                  **_: Any) -> jax.Array:
    return _randint(key, 0, high, size, to_jax(dtype or torch.int64))


@lowering(aten.randint.low, aten.randint.low_generator, random=True)
def _randint_low(key: Any, low: int, high: int, size: Sequence[int], *, dtype: torch.dtype | None = None,
                 **_: Any) -> jax.Array:
    return _randint(key, low, high, size, to_jax(dtype or torch.int64))


@lowering(aten.randint_like.default, random=True)
def _randint_like(key: Any, x: jax.Array, high: int, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return _randint(key, 0, high, x.shape, to_jax(dtype or torch_dtype(x)))


@lowering(aten.randint_like.low_dtype, random=True)
def _randint_like_low(key: Any, x: jax.Array, low: int, high: int, *, dtype: torch.dtype | None = None,
                      **_: Any) -> jax.Array:
    return _randint(key, low, high, x.shape, to_jax(dtype or torch_dtype(x)))


@lowering(aten.uniform.default, random=True)
def _uniform_op(key: Any, x: jax.Array, from_: Any = 0.0, to: Any = 1.0, **_: Any) -> jax.Array:
    return _uniform(key, x.shape, x.dtype, from_, to)


def _normal(key: Any, mean: Any, std: Any, shape: tuple[int, ...], dt: Any) -> jax.Array:
    gen = dt if dt in (jnp.float32, jnp.float64) else jnp.float32
    return (threefry.normal(key, shape, gen) * std + mean).astype(dt)


@lowering(aten.normal_functional.default, random=True)
def _normal_functional(key: Any, x: jax.Array, mean: Any = 0.0, std: Any = 1.0, **_: Any) -> jax.Array:
    return _normal(key, mean, std, x.shape, x.dtype)


@lowering(aten.normal.Tensor_float, aten.normal.float_Tensor, aten.normal.Tensor_Tensor, random=True)
def _normal_tensors(key: Any, mean: Any, std: Any = 1.0, **_: Any) -> jax.Array:
    ref = mean if hasattr(mean, "shape") and not isinstance(mean, (int, float)) else std
    shape = jnp.broadcast_shapes(jnp.shape(mean), jnp.shape(std))
    return _normal(key, mean, std, shape, ref.dtype)


@lowering(aten.normal.float_float, random=True)
def _normal_float(key: Any, mean: float, std: float, size: Sequence[int], *, dtype: torch.dtype | None = None,
                  **_: Any) -> jax.Array:
    return _normal(key, mean, std, tuple(size), _float(dtype))


@lowering(aten.bernoulli.default, aten.bernoulli.Tensor, random=True)
def _bernoulli(key: Any, x: jax.Array, p: Any = None, **_: Any) -> jax.Array:
    probs = x if p is None else p
    u = threefry.uniform(key, x.shape, jnp.float32 if x.dtype != jnp.float64 else jnp.float64)
    return (u < jnp.broadcast_to(probs, x.shape).astype(u.dtype)).astype(x.dtype)


@lowering(aten.bernoulli.p, random=True)
def _bernoulli_p(key: Any, x: jax.Array, p: Any = 0.5, **_: Any) -> jax.Array:
    u = threefry.uniform(key, x.shape, jnp.float64 if x.dtype == jnp.float64 else jnp.float32)
    return (u < p).astype(x.dtype)


@lowering(aten.exponential.default, random=True)
def _exponential(key: Any, x: jax.Array, lambd: Any = 1.0, **_: Any) -> jax.Array:
    gen = x.dtype if x.dtype in (jnp.float32, jnp.float64) else jnp.float32
    return (-jnp.log1p(-threefry.uniform(key, x.shape, gen)) / lambd).astype(x.dtype)


@lowering(aten.random.default, aten.random.to, getattr(aten.random, "from"), random=True)
def _random(key: Any, x: jax.Array, *args: Any, **_: Any) -> jax.Array:
    ints = [a for a in args if a is None or isinstance(a, int)]
    if not ints:
        low = 0
        high = 2 ** min(jnp.finfo(x.dtype).nmant + 1, 63) if jnp.issubdtype(x.dtype, jnp.floating) else \
            (2 if x.dtype == jnp.bool_ else int(jnp.iinfo(x.dtype).max) + 1)
    elif len(ints) == 1:
        low, high = 0, ints[0]
    else:
        low, high = ints[0], ints[1] if ints[1] is not None else int(jnp.iinfo(jnp.int64).max)
    return jax.random.randint(key, x.shape, low, high, jnp.int64).astype(x.dtype)


@lowering(aten.randperm.default, aten.randperm.generator, random=True)
def _randperm(key: Any, n: int, *, dtype: torch.dtype | None = None, **_: Any) -> jax.Array:
    return jax.random.permutation(key, n).astype(to_jax(dtype or torch.int64))


@lowering(aten.multinomial.default, random=True)
def _multinomial(key: Any, probs: jax.Array, num_samples: int, replacement: bool = False, **_: Any) -> jax.Array:
    logits = jnp.log(probs.astype(jnp.float64 if probs.dtype == jnp.float64 else jnp.float32))
    if replacement:
        shape = probs.shape[:-1] + (num_samples,)
        draws = jax.random.categorical(key, logits[..., None, :], axis=-1, shape=shape)
        return draws.astype(jnp.int64)
    if num_samples > probs.shape[-1]:
        raise ValueError(f"multinomial: num_samples={num_samples} > {probs.shape[-1]} categories without replacement")
    gumbel = jax.random.gumbel(key, probs.shape, logits.dtype)
    return jax.lax.top_k(logits + gumbel, num_samples)[1].astype(jnp.int64)


@lowering(aten.native_dropout.default, random=True)
def _native_dropout(key: Any, x: jax.Array, p: float, train: bool | None) -> tuple[jax.Array, jax.Array]:
    if not train or p == 0:
        return x, jnp.ones(x.shape, jnp.bool_)
    if p == 1:
        return jnp.zeros_like(x), jnp.zeros(x.shape, jnp.bool_)
    keep = threefry.uniform(key, x.shape, jnp.float32) >= p
    return jnp.where(keep, x * cast(1.0 / (1.0 - p), torch_dtype(x)), jnp.zeros((), x.dtype)), keep


@lowering(aten.native_dropout_backward.default)
def _native_dropout_backward(grad: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    return (grad * mask.astype(grad.dtype) * cast(scale, torch_dtype(grad))).astype(grad.dtype)


# In-place random overloads whose functional counterpart has a different name.
lowering(aten.bernoulli_.float, random=True)(_bernoulli_p)
lowering(aten.bernoulli_.Tensor, random=True)(_bernoulli)
lowering(aten.normal_.default, random=True)(_normal_functional)
