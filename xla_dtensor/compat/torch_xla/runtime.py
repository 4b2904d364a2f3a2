"""``torch_xla.runtime`` (``xr``): device counts and SPMD switches, single-controller view.

Under SPMD torch_xla runs one process per host that drives all its devices through one
virtual device, so the "world" is the process count, an ordinal is the process index,
and the plain device counts (``global_device_count``, ``addressable_device_count``,
``local_device_count``) count that virtual device; the ``*_runtime_*`` counts are the
chips, as here.

Example:
    >>> import xla_dtensor.compat.torch_xla.runtime as xr
    >>> xr.world_size(), xr.global_ordinal(), xr.global_runtime_device_count(), xr.global_device_count()
    (1, 0, 8, 1)
"""
from __future__ import annotations

from typing import Any

import jax

from xla_dtensor import runtime as _rt
from xla_dtensor.spmd import runtime as _spmd_rt
# the same as the project's own: the job's processes and devices, SPMD always on
from xla_dtensor.spmd.runtime import (  # noqa: F401  (re-exported)
    addressable_runtime_device_count, global_runtime_device_count, is_spmd, process_count, process_index,
)

__all__ = [
    "addressable_device_count", "addressable_runtime_device_count", "device_type", "global_device_count",
    "global_ordinal", "global_runtime_device_attributes", "global_runtime_device_count", "host_index",
    "initialize_cache", "is_spmd", "local_device_count", "local_ordinal", "local_process_count",
    "process_count", "process_index", "use_spmd", "world_size",
]


def use_spmd(auto: bool = False) -> None:
    """Switch SPMD on (always on here); ``auto=True`` switches on the AUTO sharding policy,
    which plans at the first ``sync()`` of a training step that runs an optimizer."""
    _spmd_rt.use_spmd(auto)


def world_size() -> int:
    """Processes in the job (torch_xla under SPMD: one per host)."""
    return jax.process_count()


def global_ordinal() -> int:
    """This process's index in the job."""
    return jax.process_index()


def local_ordinal() -> int:
    """0: one process drives all of a host's devices."""
    return 0


def host_index() -> int:
    return jax.process_index()


def local_process_count() -> int:
    """1: one process per host."""
    return 1


def global_device_count() -> int:
    """torch_xla's *logical* device count: under SPMD each process has one virtual device
    that spans its chips, so this is the process count (``global_runtime_device_count``
    counts the chips)."""
    return jax.process_count()


def addressable_device_count() -> int:
    """1: the process's one virtual SPMD device (``addressable_runtime_device_count`` counts
    the chips it drives)."""
    return 1


def local_device_count() -> int:
    """The virtual SPMD devices on this host: ``local_process_count() *
    addressable_device_count()``, 1 under SPMD as in torch_xla."""
    return local_process_count() * addressable_device_count()


def device_type() -> str:
    """The accelerator kind in upper case: ``"CPU"``, ``"GPU"`` or ``"TPU"``."""
    return jax.devices()[0].platform.upper()


def global_runtime_device_attributes() -> list[dict[str, Any]]:
    """One dict per device: ``name``, ``id``, ``process_index``, plus ``slice_index`` and
    ``coords`` where the device reports them."""
    out = []
    for d in sorted(jax.devices(), key=lambda d: d.id):
        attrs: dict[str, Any] = {"name": f"{d.platform.upper()}:{d.id}", "id": d.id,
                                 "process_index": d.process_index}
        for key in ("slice_index", "coords"):
            if getattr(d, key, None) is not None:
                attrs[key] = getattr(d, key)
        out.append(attrs)
    return out


def initialize_cache(path: str, readonly: bool = False) -> bool:
    """The persistent compilation cache in ``path`` (see :func:`xla_dtensor.runtime.initialize_cache`)."""
    return _rt.initialize_cache(path, readonly)
