"""``torch_xla.distributed.spmd`` (``xs``) on xla_dtensor; table in docs/migrating_from_torch_xla.md.

Example:
    >>> import torch, numpy as np
    >>> import xla_dtensor.compat.torch_xla.core.xla_model as xm
    >>> import xla_dtensor.compat.torch_xla.distributed.spmd as xs
    >>> mesh = xs.Mesh(np.arange(8), (4, 2), ("data", "model"))
    >>> t = torch.randn(8, 32).to(xm.xla_device())
    >>> xs.mark_sharding(t, mesh, ("data", None)).sharding_spec
    '{devices=[4,1,2]<=[8] last_tile_dim_replicate}'
"""
from __future__ import annotations

from xla_dtensor.compat.torch_xla.distributed.spmd._annotate import (
    AlreadyShardedError, ShardingSpec, ShardingType, clear_sharding, dynamo_mark_sharding, get_sharding_spec,
    mark_sharding,
)
from xla_dtensor.compat.torch_xla.distributed.spmd._mesh import (
    HybridMesh, Mesh, get_1d_mesh, get_global_mesh, set_global_mesh,
)
from xla_dtensor.compat.torch_xla.distributed.spmd._regions import (
    ManualShardingError, _mark_manual_sharding, apply_backward_optimization_barrier, disable_manual_sharding,
    enable_manual_sharding, optimization_barrier_, shard_as,
)
from xla_dtensor.compat.torch_xla.distributed.spmd._tensor import (
    XLAShard, XLAShardedTensor, unwrap_sharded_tensor, wrap_as_sharded_tensor, wrap_if_sharded,
)
from xla_dtensor.spmd import distribute_module as xla_distribute_module
from xla_dtensor.spmd import distribute_tensor as xla_distribute_tensor
from xla_dtensor.spmd import mark_sharding_with_gradients

__all__ = [
    "AlreadyShardedError", "HybridMesh", "ManualShardingError", "Mesh", "ShardingSpec", "ShardingType", "XLAShard",
    "XLAShardedTensor", "apply_backward_optimization_barrier", "clear_sharding", "disable_manual_sharding",
    "dynamo_mark_sharding", "enable_manual_sharding", "get_1d_mesh", "get_global_mesh", "get_sharding_spec",
    "mark_sharding", "mark_sharding_with_gradients", "optimization_barrier_", "set_global_mesh", "shard_as",
    "unwrap_sharded_tensor", "wrap_as_sharded_tensor", "wrap_if_sharded", "xla_distribute_module",
    "xla_distribute_tensor", "_mark_manual_sharding",
]
