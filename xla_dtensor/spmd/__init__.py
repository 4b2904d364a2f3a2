"""SPMD on the lazy device: torch_xla-style annotations and the DTensor API on an xla mesh.

Example:
    >>> import torch, xla_dtensor
    >>> import xla_dtensor.spmd as xs
    >>> m = xs.Mesh(range(8), (4, 2), ("data", "model"))
    >>> t = torch.randn(16, 8).to(xla_dtensor.device())
    >>> xs.mark_sharding(t, m, ("data", "model")).sharding_spec
    '{devices=[4,2]<=[8]}'
"""
from __future__ import annotations

from mesh import HybridMesh, Mesh
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd.annotate import (
    as_mesh,
    clear_sharding,
    get_hlo_sharding,
    get_spec,
    install_hooks,
    mark_sharding,
    submesh,
)
from xla_dtensor.spmd.api import distribute_tensor, init_device_mesh
from xla_dtensor.spmd.auto import AUTO, AutoPolicy, auto_stats, last_plan
from xla_dtensor.spmd.errors import (
    AlreadyDistributedError,
    DependencyImportError,
    MeshDevicesError,
    NotShardableError,
    TorchVersionError,
)
from xla_dtensor.spmd.gradients import mark_sharding_with_gradients
from xla_dtensor.spmd.module import constrain_activation, distribute_module
from xla_dtensor.spmd.parallelize import PlanError, parallelize_module
from xla_dtensor.spmd.runtime import get_1d_mesh, use_spmd
from xla_dtensor.spmd.sharded_tensor import XLAShard, XLAShardedTensor
from xla_dtensor.spmd.inspect import last_compiled_hlo, to_host, visualize_tensor_sharding

install_hooks()

__all__ = [
    "AUTO", "AlreadyDistributedError", "AutoPolicy", "auto_stats", "last_plan", "DependencyImportError", "HybridMesh", "Mesh", "MeshDevicesError",
    "NotShardableError", "PlanError", "TorchVersionError", "ShardingSpec", "XLAShard", "XLAShardedTensor", "as_mesh", "clear_sharding",
    "constrain_activation", "distribute_module", "distribute_tensor", "get_1d_mesh", "get_hlo_sharding",
    "get_spec", "init_device_mesh", "last_compiled_hlo", "mark_sharding",
    "mark_sharding_with_gradients", "parallelize_module", "submesh", "to_host", "use_spmd", "visualize_tensor_sharding",
]
