"""torch <-> JAX dtypes for the lazy device, with the device's own error type."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.ops.dtypes import _TO_JAX, _TO_TORCH  # one table for lowerings and device


class UnsupportedDtypeError(TypeError):
    """A torch dtype the lazy device cannot hold."""


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype of torch ``dtype``; raises :class:`UnsupportedDtypeError`.

    Example:
        >>> to_jax(torch.float32)
        dtype('float32')
    """
    try:
        return _TO_JAX[dtype]
    except KeyError:
        allowed = ", ".join(str(d) for d in _TO_JAX)
        raise UnsupportedDtypeError(f"dtype {dtype} is not supported on the jax device; supported: {allowed}") from None


def to_torch(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of JAX/numpy ``dtype``."""
    try:
        return _TO_TORCH[jnp.dtype(dtype)]
    except KeyError:
        raise UnsupportedDtypeError(f"JAX dtype {dtype} has no torch counterpart") from None


def supported(dtype: torch.dtype) -> bool:
    """Whether the device can hold ``dtype``."""
    return dtype in _TO_JAX
