"""Exceptions of :mod:`xla_dtensor.spmd`; every message shows the bad value and what is allowed."""
from __future__ import annotations

from mesh.errors import MeshDevicesError  # a mesh names devices JAX does not have, or a reshard changes the device set
from xla_dtensor.sharding.errors import ShardingError


class NotShardableError(ShardingError, TypeError):
    """The object cannot carry a sharding (not a tensor on the ``jax`` device, wrong kind)."""


class AlreadyDistributedError(RuntimeError):
    """``distribute_module`` was applied twice to the same module."""


class MetaParameterError(RuntimeError):
    """A sharded tensor still on the ``meta`` device was used as data (a forward before
    ``to_empty``), copied out, or allocated on a device that is not the jax device."""


class DependencyImportError(RuntimeError):
    """An ``ImportError`` raised inside xla_dtensor while torch's DTensor API called it.

    torch wraps every ``ImportError`` from the xla hook into "install torch_xla"; this
    type carries the original message instead (the original is the ``__cause__``).
    """


class TorchVersionError(RuntimeError):
    """The installed torch cannot run sharded tensors: it sends every subclass of ``DTensor``
    (``XLAShardedTensor`` is one) through DTensor's own C++ dispatcher instead of the
    subclass's ``__torch_dispatch__`` (torch 2.10 and 2.11; pytorch/pytorch#177716)."""


__all__ = ["AlreadyDistributedError", "DependencyImportError", "MeshDevicesError", "MetaParameterError",
           "NotShardableError", "TorchVersionError"]
