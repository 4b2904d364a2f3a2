"""Exception types raised by :mod:`xla_dtensor.sharding`.

Every message shows the offending value and what would have been accepted.
"""
from __future__ import annotations


class ShardingError(ValueError):
    """Base class for invalid or inexpressible sharding descriptions."""


class SpecTypeError(ShardingError, TypeError):
    """A spec entry, placement or argument has the wrong Python type."""


class UnknownAxisError(ShardingError, KeyError):
    """A mesh axis name or index that the mesh does not have."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


class DuplicateAxisError(ShardingError):
    """A mesh axis is used twice (in one tensor dim, on two tensor dims, or sharded and partial)."""


class RankError(ShardingError):
    """A spec, placement list or shape has the wrong number of dimensions."""


class PlacementError(ShardingError):
    """A DTensor placement that cannot be used (``_StridedShard``, a bad ``Shard`` dim, ...)."""


class NotExpressibleError(ShardingError):
    """A layout exists but cannot be written in the requested form (e.g. on this mesh)."""


class PendingReductionError(NotExpressibleError):
    """A spec with ``Partial`` axes was asked for a form that has no pending reductions."""


class HloParseError(ShardingError):
    """A malformed HLO sharding string."""
