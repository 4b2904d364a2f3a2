"""Default to 8 virtual CPU devices when the user has not chosen, before JAX starts.

NOTE: XLA reads ``XLA_FLAGS`` when its CPU backend is created, so this must run before
the first ``jax.devices()``; importing :mod:`mesh` (or :mod:`xla_dtensor`) does it.
``XLA_DTENSOR_CPU_DEVICES`` overrides the count; an existing
``--xla_force_host_platform_device_count`` in ``XLA_FLAGS`` is left alone.
"""
from __future__ import annotations

import os
import sys

_FLAG = "--xla_force_host_platform_device_count"
DEFAULT_CPU_DEVICES = 8


def _backends_started() -> bool:
    bridge = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(bridge, "_backends", None))


def ensure_virtual_cpu_devices() -> None:
    """Add the virtual-device flag to ``XLA_FLAGS`` unless already set or too late."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _FLAG in flags or _backends_started():
        return
    count = int(os.environ.get("XLA_DTENSOR_CPU_DEVICES", DEFAULT_CPU_DEVICES))
    os.environ["XLA_FLAGS"] = f"{flags} {_FLAG}={count}".strip()
