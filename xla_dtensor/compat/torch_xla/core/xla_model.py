"""``torch_xla.core.xla_model`` (``xm``): the device, step barriers and process facts.

Example:
    >>> import torch
    >>> import xla_dtensor.compat.torch_xla.core.xla_model as xm
    >>> t = torch.ones(2, device=xm.xla_device()) * 3
    >>> xm.mark_step(); t.tolist()
    [3.0, 3.0]
"""
from __future__ import annotations

import sys
from typing import Any, TextIO

import jax
import torch

import xla_dtensor
from xla_dtensor.compat.torch_xla import runtime as xr

__all__ = [
    "get_local_ordinal", "get_ordinal", "get_xla_supported_devices", "is_master_ordinal", "mark_step",
    "master_print", "optimizer_step", "wait_device_ops", "xla_device", "xla_device_hw", "xrt_world_size",
]


def xla_device(n: int | None = None, devkind: str | None = None) -> torch.device:
    """The lazy ``jax`` device; ``n`` and ``devkind`` are accepted (one logical device under SPMD).

    Raises:
        ValueError: ``n`` is not a device index of this process.
    """
    if n is not None and not 0 <= int(n) < jax.local_device_count():
        raise ValueError(f"xla_device(n={n!r}): this process has devices 0..{jax.local_device_count() - 1}")
    return xla_dtensor.device()


def mark_step(wait: bool = False, reset_scope: bool = True) -> None:
    """Cut the lazy graph and run it (``xla_dtensor.sync``); ``wait=True`` blocks until done."""
    xla_dtensor.sync(wait=wait)


def wait_device_ops(devices: Any = None) -> None:
    """Block until every dispatched computation has finished (``xla_dtensor.wait``)."""
    xla_dtensor.wait()


def get_xla_supported_devices(devkind: str | None = None, max_devices: int | None = None) -> list[str]:
    """``["xla:0"]``: what torch_xla lists under SPMD (the one virtual device of this process;
    ``xr.addressable_runtime_device_count()`` counts the chips behind it)."""
    return ["xla:0"][:None if max_devices is None else max(0, int(max_devices))]


def xla_device_hw(device: Any) -> str:
    """``"CPU"``, ``"GPU"`` or ``"TPU"``: the kind of the JAX devices behind the lazy device."""
    return xr.device_type()


def xrt_world_size() -> int:
    return xr.world_size()


def get_ordinal() -> int:
    return xr.global_ordinal()


def get_local_ordinal() -> int:
    return xr.local_ordinal()


def is_master_ordinal(local: bool = True) -> bool:
    return (xr.local_ordinal() if local else xr.global_ordinal()) == 0


def master_print(*args: Any, fd: TextIO | None = None, local: bool = False, flush: bool = False) -> None:
    """``print(*args, file=fd, flush=flush)`` on the master ordinal only (``local``: of this host)."""
    if is_master_ordinal(local=local):
        print(*args, file=sys.stdout if fd is None else fd, flush=flush)


def optimizer_step(optimizer: torch.optim.Optimizer, barrier: bool = False,
                   optimizer_args: dict[str, Any] | None = None, groups: Any = None, pin_layout: bool = True) -> Any:
    """``optimizer.step(**optimizer_args)``; under SPMD XLA reduces the gradients inside the
    program, so there is no separate all-reduce (``groups`` / ``pin_layout`` are accepted and
    unused). ``barrier=True`` also runs ``mark_step``. Returns what ``step`` returns."""
    loss = optimizer.step(**(optimizer_args or {}))
    if barrier:
        mark_step()
    return loss
