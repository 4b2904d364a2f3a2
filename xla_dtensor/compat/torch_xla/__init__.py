"""torch_xla's SPMD user surface on xla_dtensor: swap ``torch_xla`` for this prefix.

Example:
    >>> import xla_dtensor.compat.torch_xla as torch_xla
    >>> import xla_dtensor.compat.torch_xla.runtime as xr
    >>> xr.use_spmd(); xr.global_runtime_device_count()
    8
    >>> torch_xla.device().type
    'jax'
"""
from __future__ import annotations

import torch

import xla_dtensor

__all__ = ["device", "sync"]


def device(index: int | None = None) -> torch.device:
    """The lazy ``jax`` device (one logical device: SPMD programs span all of them)."""
    return xla_dtensor.device()


def sync(wait: bool = False) -> None:
    """Run the pending lazy work (``torch_xla.sync``); ``wait=True`` also blocks on it."""
    xla_dtensor.sync(wait=wait)
