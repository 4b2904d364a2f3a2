"""torch <-> JAX dtype mapping for the lazy device."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import torch

_TO_JAX: dict[torch.dtype, np.dtype] = {
    torch.bool: jnp.dtype(jnp.bool_), torch.uint8: jnp.dtype(jnp.uint8), torch.int8: jnp.dtype(jnp.int8),
    torch.int16: jnp.dtype(jnp.int16), torch.int32: jnp.dtype(jnp.int32), torch.int64: jnp.dtype(jnp.int64),
    torch.uint16: jnp.dtype(jnp.uint16), torch.uint32: jnp.dtype(jnp.uint32), torch.uint64: jnp.dtype(jnp.uint64),
    torch.float16: jnp.dtype(jnp.float16), torch.bfloat16: jnp.dtype(jnp.bfloat16),
    torch.float32: jnp.dtype(jnp.float32), torch.float64: jnp.dtype(jnp.float64),
    torch.complex64: jnp.dtype(jnp.complex64), torch.complex128: jnp.dtype(jnp.complex128),
}
_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _TO_JAX.items()}


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
