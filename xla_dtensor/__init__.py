"""xla-dtensor: DTensor-native SPMD sharding for PyTorch, compiled by XLA through JAX.

Example:
    >>> import torch, xla_dtensor
    >>> x = torch.ones(2, 2, device=xla_dtensor.device())
    >>> (x + 1).sum().item()
    8.0
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (sets the virtual CPU device default before JAX starts)

from mesh import HybridMesh, Mesh, get_global_mesh, set_global_mesh  # noqa: E402
from xla_dtensor import metrics, random  # noqa: E402
from xla_dtensor import ops as _ops  # noqa: E402,F401  (registers the lowerings)
from xla_dtensor.config import config  # noqa: E402
from xla_dtensor.core import LazyTensor, device, mark_step, sync, wait  # noqa: E402
from xla_dtensor.debug import render_sharding, visualize_sharding  # noqa: E402
from xla_dtensor.random import manual_seed  # noqa: E402
from xla_dtensor.sharding import HloSharding, ShardingError, ShardingSpec, shard_indices  # noqa: E402
from xla_dtensor import spmd  # noqa: E402
from xla_dtensor.spmd import (  # noqa: E402
    XLAShardedTensor, distribute_module, distribute_tensor, init_device_mesh, mark_sharding,
    visualize_tensor_sharding,
)
from xla_dtensor import _torch_hook  # noqa: E402
from xla_dtensor import _dcp_protocol  # noqa: E402,F401  (DCP's tensor methods on LazyTensor)
from xla_dtensor import runtime  # noqa: E402  (fast paths and debuggability)
from xla_dtensor import dynamo_route as _dynamo_route  # noqa: E402
from xla_dtensor.ops import predicates as _predicates  # noqa: E402
from xla_dtensor.debug import analysis as _analysis  # noqa: E402
from xla_dtensor.debug.hlo import get_hlo, get_stablehlo  # noqa: E402
from xla_dtensor.debug.metrics_report import metrics_report, short_metrics_report  # noqa: E402
from xla_dtensor.eager import eager_mode, is_eager  # noqa: E402
from xla_dtensor.jit import compile  # noqa: E402,A004

_torch_hook.install()   # torch's DTensor API routes "xla" meshes to xla_dtensor.spmd
_analysis.install()     # XLA_DTENSOR_DEBUG execution analysis and timings
_predicates.install()    # torch.equal / torch.allclose answer a Python bool
_dynamo_route.install()  # torch.compile's default backend hands graphs on jax tensors to ours

__version__ = "0.1.0"

__all__ = [
    "HloSharding", "HybridMesh", "LazyTensor", "Mesh", "ShardingError", "ShardingSpec", "config",
    "device", "get_global_mesh", "manual_seed", "mark_step", "metrics", "random", "render_sharding",
    "set_global_mesh", "shard_indices", "sync", "visualize_sharding", "wait",
    "XLAShardedTensor", "distribute_module", "distribute_tensor", "init_device_mesh", "mark_sharding",
    "spmd", "visualize_tensor_sharding",
    "compile", "eager_mode", "get_hlo", "get_stablehlo", "is_eager", "metrics_report", "runtime",
    "short_metrics_report",
]
