"""Runtime switches: device counts, ``use_spmd``, multi-process start.

Example:
    >>> from xla_dtensor import runtime
    >>> runtime.global_runtime_device_count()
    8
"""
from __future__ import annotations

from xla_dtensor.runtime_dist import *  # noqa: F401,F403
from xla_dtensor.runtime_dist import __all__ as _dist_all

__all__ = list(_dist_all)
