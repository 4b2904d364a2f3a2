"""Seeding of random ops on the lazy device.

Each random op node gets its own PRNG key, ``uint32[2] = (seed, counter)`` in JAX's
legacy threefry key layout, fed to the graph as input data: the graph structure never
depends on the seed or the counter, so reseeding or drawing more numbers never
recompiles. Bit equality with torch's CPU generator is not a goal.

Example:
    >>> import xla_dtensor
    >>> xla_dtensor.manual_seed(0)
    >>> xla_dtensor.random.initial_seed()
    0
"""
from __future__ import annotations

import numpy as np

__all__ = ["manual_seed", "initial_seed", "seed", "next_key", "get_rng_state", "set_rng_state"]

_state = {"seed": 0, "counter": 0}


def manual_seed(seed: int) -> None:
    """Reset the device generator to ``seed`` (any int; reduced modulo 2**32).

    Example:
        >>> manual_seed(1234)
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    _state["seed"], _state["counter"] = seed % (1 << 32), 0


def seed() -> int:
    """Seed from OS entropy and return the chosen seed."""
    s = int(np.random.SeedSequence().entropy % (1 << 32))
    manual_seed(s)
    return s


def initial_seed() -> int:
    """The seed last set by :func:`manual_seed`."""
    return _state["seed"]


def next_key() -> np.ndarray:
    """A fresh ``uint32[2]`` key for one random node (internal)."""
    _state["counter"] += 1
    return np.array([_state["seed"], _state["counter"] % (1 << 32)], dtype=np.uint32)


def get_rng_state() -> tuple[int, int]:
    """``(seed, counter)``: restore it with :func:`set_rng_state`."""
    return _state["seed"], _state["counter"]


def set_rng_state(state: tuple[int, int]) -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    s, c = state
    _state["seed"], _state["counter"] = int(s) % (1 << 32), int(c)
