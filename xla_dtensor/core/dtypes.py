"""torch <-> JAX dtypes for the lazy device: the lowering table's conversions, re-exported.

Example:
    >>> import torch
    >>> to_jax(torch.float32)
    dtype('float32')
"""
from __future__ import annotations

import torch

from xla_dtensor.ops.dtypes import _TO_JAX, UnsupportedDtypeError, to_jax, to_torch

__all__ = ["UnsupportedDtypeError", "supported", "to_jax", "to_torch"]


def supported(dtype: torch.dtype) -> bool:
    """Whether the device can hold ``dtype``."""
    return dtype in _TO_JAX
