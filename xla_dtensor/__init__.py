"""xla-dtensor: DTensor-native SPMD sharding for PyTorch, compiled by XLA through JAX.

Example:
    >>> import xla_dtensor
    >>> from mesh import Mesh
    >>> spec = xla_dtensor.ShardingSpec.from_partition_spec(Mesh(range(8), (2, 4), ("dp", "tp")), ("dp", None))
    >>> str(spec.to_hlo())
    '{devices=[2,1,4]<=[8] last_tile_dim_replicate}'
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (sets the virtual CPU device default before JAX starts)
from mesh import HybridMesh, Mesh, get_global_mesh, set_global_mesh
from xla_dtensor.debug import render_sharding, visualize_sharding
from xla_dtensor.sharding import HloSharding, ShardingError, ShardingSpec, shard_indices

__version__ = "0.1.0"

__all__ = [
    "HloSharding", "HybridMesh", "Mesh", "ShardingError", "ShardingSpec", "get_global_mesh",
    "render_sharding", "set_global_mesh", "shard_indices", "visualize_sharding",
]
