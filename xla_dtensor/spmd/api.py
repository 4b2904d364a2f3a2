"""The DTensor entry points on an ``"xla"`` mesh: ``distribute_tensor``, ``init_device_mesh``.

Same signatures as ``torch.distributed.tensor``; ``import xla_dtensor`` also routes
torch's own ``distribute_tensor(t, DeviceMesh("xla", ...), placements)`` here (see
:mod:`xla_dtensor._torch_hook`). Values stay global (single-controller SPMD): the
result has the input's shape and the layout the placements describe.
"""
from __future__ import annotations

from math import prod
from typing import Any, Sequence

import jax
import numpy as np
import torch

from xla_dtensor.core.tensor import LazyTensor, meta_of, new_tensor, storage_of, value_of
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A
from xla_dtensor.core import layout as L
from xla_dtensor.spmd.errors import MeshDevicesError
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor, _wrap_plain


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def distribute_tensor(tensor: torch.Tensor, device_mesh: Any = None,
                      placements: Sequence[Any] | None = None, *,
                      src_data_rank: int | None = 0) -> XLAShardedTensor:
    """Lay ``tensor`` out on ``device_mesh`` by DTensor ``placements``.

    A CPU tensor is sent shard by shard (each device gets only its slice); a tensor on
    the jax device is resharded; a ``meta`` tensor gives a sharded meta tensor that
    remembers the layout, allocated shard by shard by ``module.to_empty``
    (:mod:`xla_dtensor.spmd.meta_init`). Uneven dims are padded internally; the result keeps the
    logical shape. ``Partial`` placements: ``tensor`` is the global (reduced) value, as in
    torch; those mesh axes hold replicas and ``.placements`` reports the ``Partial``
    until the tensor is redistributed or written in place.

    Args:
        tensor: a CPU or jax-device tensor (the global value).
        device_mesh: a torch ``DeviceMesh("xla", ...)``, a :class:`mesh.Mesh`, or ``None``
            (the global mesh).
        placements: one ``Shard(d)`` / ``Replicate()`` / ``Partial()`` per mesh axis
            (default: all ``Replicate()``).
        src_data_rank: accepted for signature compatibility (the value is global).

    Raises:
        RankError: wrong number of placements. PlacementError: ``Shard(d)`` out of range.
        MeshDevicesError: the mesh names devices JAX does not have.

    Example:
        >>> import torch, xla_dtensor
        >>> from torch.distributed.tensor import Shard
        >>> from mesh import Mesh
        >>> d = distribute_tensor(torch.ones(10, 3), Mesh(range(4), (4,), ("x",)), [Shard(0)])
        >>> tuple(d.shape), [tuple(s.data.shape) for s in d.local_shards]
        ((10, 3), [(3, 3), (3, 3), (3, 3), (1, 3)])
    """
    m = A.as_mesh(device_mesh)
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"distribute_tensor expects a torch.Tensor, got {type(tensor).__name__}")
    from torch.distributed.tensor.placement_types import Replicate
    placements = list(placements) if placements is not None else [Replicate()] * m.ndim
    spec = ShardingSpec.from_placements(m, placements, tensor.dim())
    shape, dtype = tuple(tensor.shape), tensor.dtype
    if tensor.is_meta:  # a meta module: the layout now, the shards at to_empty (spmd.meta_init)
        from xla_dtensor.spmd.meta_init import meta_sharded
        stride = meta_of(tensor)[2] if isinstance(tensor, LazyTensor) else _contiguous(shape)
        res = meta_sharded(shape, dtype, stride, spec, device_mesh)
        return res.requires_grad_(tensor.requires_grad) if tensor.requires_grad else res
    if isinstance(tensor, LazyTensor):
        value = L.reshard(value_of(tensor), shape, dtype, spec.reduced())
        meta = (shape, dtype, meta_of(tensor)[2])
    else:
        value = L.place_host(tensor, spec.reduced())
        meta = (shape, dtype, _contiguous(shape))
    out = new_tensor(meta, value)
    A.stick(storage_of(out), spec.reduced())
    res = _wrap_plain(out)._record(spec, device_mesh)
    return res.requires_grad_(tensor.requires_grad) if tensor.requires_grad else res


def init_device_mesh(device_type: str, mesh_shape: Sequence[int], *,
                     mesh_dim_names: Sequence[str] | None = None) -> Any:
    """A torch ``DeviceMesh("xla", ...)`` over the first ``prod(mesh_shape)`` JAX devices.

    Example:
        >>> init_device_mesh("xla", (4, 2), mesh_dim_names=("dp", "tp")).shape
        (4, 2)
    """
    if device_type not in ("xla", "jax"):
        raise ValueError(f"xla_dtensor.init_device_mesh builds 'xla' meshes, got device_type="
                         f"{device_type!r}; use torch.distributed.init_device_mesh for others")
    shape = tuple(int(s) for s in mesh_shape)
    devices = sorted(d.id for d in jax.devices())
    if prod(shape) > len(devices):
        raise MeshDevicesError(f"mesh_shape {shape} needs {prod(shape)} devices but JAX has "
                               f"{len(devices)} (ids {devices})")
    from torch.distributed.device_mesh import DeviceMesh
    grid = np.asarray(devices[:prod(shape)]).reshape(shape)
    return DeviceMesh("xla", grid.tolist(), mesh_dim_names=tuple(mesh_dim_names) if mesh_dim_names else None)
