"""Check a mesh's device ids against the devices JAX has (``Mesh(..., validate=True)``)."""
from __future__ import annotations

from typing import Any, Sequence

from mesh.errors import MeshDevicesError

_KNOWN: list[Any] = [None, frozenset()]  # [the list jax.devices() returned, its ids]


def known_device_ids() -> frozenset[int]:
    """Ids of ``jax.devices()`` (starts JAX's backends on the first call)."""
    import jax

    devices = jax.devices()
    if _KNOWN[0] is not devices:
        _KNOWN[:] = [devices, frozenset(d.id for d in devices)]
    return _KNOWN[1]


def format_ids(ids: Sequence[int], limit: int = 16) -> str:
    """``[8, 9, 10]``, or ``[8, 9, ..., 255] (248 ids)`` when long."""
    ids = sorted(ids)
    if len(ids) <= limit:
        return str(ids)
    return f"[{ids[0]}, {ids[1]}, ..., {ids[-1]}] ({len(ids)} ids)"


def check_device_ids(device_ids: Sequence[int], what: str) -> None:
    """Raise :class:`MeshDevicesError` unless every id is one of JAX's devices.

    Example:
        >>> check_device_ids(range(8), "Mesh(x=8)")
    """
    known = known_device_ids()
    missing = [i for i in device_ids if i not in known]
    if not missing:
        return
    import jax

    need = max(device_ids) + 1
    platform = jax.default_backend()
    raise MeshDevicesError(
        f"{what} names device ids {format_ids(missing)} that JAX does not have: JAX has "
        f"{len(known)} {platform} device(s), ids {format_ids(list(known))}. For more virtual CPU "
        f"devices set XLA_DTENSOR_CPU_DEVICES={need} (or XLA_FLAGS="
        f"--xla_force_host_platform_device_count={need}) before importing mesh, xla_dtensor or "
        "jax; to describe a mesh of another machine (planning only), pass validate=False")
