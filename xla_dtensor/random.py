"""Seeding of random ops on the jax device (``xla_dtensor.manual_seed`` and friends).

The generator itself lives with the random lowerings (:mod:`xla_dtensor.ops.random`):
each random node gets its own threefry key ``(seed, counter)``, fed to the graph as input
data, so reseeding or drawing more numbers never recompiles. Bit equality with torch's
CPU generator is not a goal; distributions are.

Example:
    >>> import xla_dtensor
    >>> xla_dtensor.manual_seed(0)
    >>> xla_dtensor.random.initial_seed()
    0
"""
from __future__ import annotations

import torch

from xla_dtensor.ops import random as _gen

__all__ = ["manual_seed", "initial_seed", "seed", "next_key", "get_rng_state", "set_rng_state"]

next_key = _gen.next_key
initial_seed = _gen.initial_seed
seed = _gen.seed
get_rng_state = _gen.get_rng_state


def manual_seed(seed: int) -> None:
    """Reset the device generator to ``seed`` (an int).

    Example:
        >>> manual_seed(1234)
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}: {seed!r}")
    _gen.manual_seed(seed)


def set_rng_state(state: torch.Tensor) -> None:
    """Restore a state returned by :func:`get_rng_state`."""
    _gen.set_rng_state(state)
