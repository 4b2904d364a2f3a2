"""Multi-device / multi-process runtime functions (re-exported by ``xla_dtensor.runtime``).

Example:
    >>> from xla_dtensor import runtime_dist
    >>> runtime_dist.global_runtime_device_count()
    8
"""
from __future__ import annotations

from xla_dtensor.spmd.runtime import (
    addressable_runtime_device_count,
    get_1d_mesh,
    global_runtime_device_count,
    initialize_distributed,
    is_spmd,
    process_count,
    process_index,
    use_spmd,
)

__all__ = [
    "addressable_runtime_device_count", "get_1d_mesh", "global_runtime_device_count",
    "initialize_distributed", "is_spmd", "process_count", "process_index", "use_spmd",
]
