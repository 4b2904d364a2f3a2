"""Exception types raised by :mod:`mesh`; each message shows the bad value and what is allowed."""
from __future__ import annotations


class MeshError(ValueError):
    """Base class for invalid mesh descriptions."""


class MeshShapeError(MeshError):
    """The mesh shape does not fit the devices (wrong product, non-positive sizes)."""


class DeviceIdError(MeshError):
    """Device ids are duplicated, negative, not integers, or unknown to JAX."""


class MeshDevicesError(DeviceIdError):
    """A mesh names device ids that JAX does not have (``validate=False`` skips the check)."""


class AxisError(MeshError, KeyError):
    """An axis name or index is unknown, or an axis name is used twice."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class TopologyError(MeshError):
    """A topology does not match its mesh, or a preset name is unknown."""
