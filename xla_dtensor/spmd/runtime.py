"""Process-level SPMD runtime: device counts, ``use_spmd``, the 1-D mesh.

Re-exported by :mod:`xla_dtensor.runtime_dist` (which also holds the multi-process start,
``initialize_distributed``) and ``xla_dtensor.runtime``.
"""
from __future__ import annotations

from typing import Any

import jax

from mesh import Mesh

_SPMD = {"on": True}


def use_spmd(auto: bool = False, *, mesh: Any = None, **options: Any) -> None:
    """Switch SPMD on (torch_xla compatibility); ``auto=True`` also switches on the AUTO policy.

    Every program is SPMD over all JAX devices already. With ``auto=True`` every
    optimizer that steps parameters on the jax device not yet planned is auto-sharded
    at the first ``sync()`` of its training step (parameters named ``param{i}`` in
    optimizer order; see :mod:`xla_dtensor.spmd.auto`). ``use_spmd(auto=False)`` turns
    that off for optimizers not seen yet.

    Args:
        auto: use the auto-sharder.
        mesh: the mesh to plan on (``Mesh``, torch ``DeviceMesh("xla", ...)``); default:
            the global mesh, else all devices on one axis ``"data"``.
        **options: :class:`xla_dtensor.spmd.auto.AutoPolicy` fields (``memory_budget``,
            ``time_limit``, ``topology``, ``keep_user_sharding``, ``cache_dir``).

    Example:
        >>> use_spmd()
    """
    from xla_dtensor.spmd import auto as _auto
    if not auto:
        if options or mesh is not None:
            raise TypeError(f"use_spmd options {sorted(options) + (['mesh'] if mesh is not None else [])} "
                            f"only apply with auto=True")
        _auto.disable_global()
    else:
        from mesh import get_global_mesh
        from xla_dtensor.spmd.annotate import as_mesh
        m = as_mesh(mesh) if mesh is not None else (get_global_mesh() or get_1d_mesh("data"))
        _auto.enable_global(as_mesh(m), _auto.AutoPolicy(**options))
    _SPMD["on"] = True


def is_spmd() -> bool:
    return _SPMD["on"]


def global_runtime_device_count() -> int:
    """Devices in all processes (``jax.device_count()``)."""
    return jax.device_count()


def addressable_runtime_device_count() -> int:
    """Devices this process drives (``jax.local_device_count()``)."""
    return jax.local_device_count()


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """All devices on one axis, in device-id order.

    Example:
        >>> get_1d_mesh("data").shape()
        OrderedDict([('data', 8)])
    """
    ids = sorted(d.id for d in jax.devices())
    return Mesh(ids, (len(ids),), (axis_name,) if axis_name else None)
