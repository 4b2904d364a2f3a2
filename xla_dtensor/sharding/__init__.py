"""Sharding layouts: one value type and its exact conversions.

:class:`ShardingSpec` says how a tensor is laid out on a :class:`mesh.Mesh`; it
converts to and from torch_xla partition specs, DTensor placements, JAX
``PartitionSpec``/``NamedSharding`` and HLO sharding strings. :class:`HloSharding`
is the lower-level XLA annotation (also maximal and arbitrary device orders).

Example:
    >>> from mesh import Mesh
    >>> from xla_dtensor.sharding import ShardingSpec
    >>> m = Mesh(range(8), (2, 4), ("data", "model"))
    >>> spec = ShardingSpec.from_partition_spec(m, ("data", "model"))
    >>> str(spec.to_hlo())
    '{devices=[2,4]<=[8]}'
    >>> spec.to_placements()
    (Shard(dim=0), Shard(dim=1))
"""
from __future__ import annotations

from xla_dtensor.sharding.errors import (
    DuplicateAxisError,
    HloParseError,
    NotExpressibleError,
    PendingReductionError,
    PlacementError,
    RankError,
    ShardingError,
    SpecTypeError,
    UnknownAxisError,
)
from xla_dtensor.sharding.hlo import HloSharding, iota_form
from xla_dtensor.sharding.indices import chunk_range, shard_indices
from xla_dtensor.sharding.spec import ShardingSpec

__all__ = [
    "DuplicateAxisError", "HloParseError", "HloSharding", "NotExpressibleError",
    "PendingReductionError", "PlacementError", "RankError", "ShardingError", "ShardingSpec",
    "SpecTypeError", "UnknownAxisError", "chunk_range", "iota_form", "shard_indices",
]
