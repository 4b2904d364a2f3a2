"""FSDP through SPMD annotations (torch_xla's FSDPv2 idea): shard parameters and the batch.

Every parameter is split along its largest dim divisible by the ``fsdp`` axis size
(replicated when none divides); the model's tensor inputs, positional and keyword, are
split along their batch dim (dim 0). XLA then inserts the all-gathers before use and the reduce-scatters of the
gradients; parameters and optimizer state stay sharded across steps.

Example:
    >>> import torch, xla_dtensor
    >>> from mesh import Mesh
    >>> m = shard_model(torch.nn.Linear(8, 16), Mesh(range(8), (8,), ("fsdp",)))
    >>> xla_dtensor.spmd.get_spec(m.weight).to_partition_spec()
    ('fsdp', None)
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn

from xla_dtensor.core import device
from xla_dtensor.core.ir import DATA
from xla_dtensor.core.tensor import LazyTensor, is_view, storage_of
from xla_dtensor.spmd.api import distribute_tensor
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd.module import constrain_activation

__all__ = ["shard_model", "shard_dim"]


def shard_dim(shape: tuple[int, ...], n: int) -> int | None:
    """The largest dim of ``shape`` divisible by ``n`` (the first of equal ones), else ``None``.

    Example:
        >>> shard_dim((6, 16), 8), shard_dim((3,), 8)
        (1, None)
    """
    best = None
    for d, size in enumerate(shape):
        if size % n == 0 and size >= n and (best is None or size > shape[best]):
            best = d
    return best


def shard_model(model: nn.Module, mesh: Any, axis: str = "fsdp", *, shard_inputs: bool = True) -> nn.Module:
    """Shard ``model`` (moved to the jax device, in place) FSDP-style on mesh axis ``axis``.

    A model on the ``meta`` device gets sharded meta parameters (and replicated meta
    buffers) that ``model.to_empty(device=xla_dtensor.device())`` allocates shard by shard.

    Args:
        model: the module.
        mesh: a :class:`mesh.Mesh` or torch ``DeviceMesh("xla", ...)`` with an axis ``axis``.
        axis: the mesh axis that shards parameters and the batch.
        shard_inputs: add a forward pre-hook splitting tensor inputs, positional and
            keyword, along dim 0.
    """
    m = A.as_mesh(mesh)
    n = m.axis_size(axis)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        _shard_meta(model, m, axis, n)
    else:
        model.to(device())
        for p in model.parameters():
            d = shard_dim(tuple(p.shape), n)
            spec = tuple(axis if i == d else None for i in range(p.dim()))
            A.mark_sharding(p.data if isinstance(p, nn.Parameter) else p, m, spec)
    if shard_inputs:
        from torch.distributed.tensor.placement_types import Replicate, Shard
        placements = [Shard(0) if i == m.axis_index(axis) else Replicate() for i in range(m.ndim)]

        def split_batch(mod: nn.Module, inputs: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return (tuple(_split_input(x, m, placements) for x in inputs),
                    {k: _split_input(v, m, placements) for k, v in kwargs.items()})
        model.register_forward_pre_hook(split_batch, with_kwargs=True)
    return model


def _split_input(x: Any, m: Any, placements: list) -> Any:
    """A tensor input (positional or keyword: ``model(input_ids=..., labels=...)``) split along dim 0."""
    return _split(x, m, placements) if isinstance(x, LazyTensor) and x.dim() > 0 else x


def _shard_meta(model: nn.Module, m: Any, axis: str, n: int) -> None:
    """A meta model: every parameter becomes a sharded meta tensor (``to_empty`` allocates
    the shards; tied parameters stay tied), every buffer a replicated one."""
    from torch.distributed.tensor.placement_types import Replicate, Shard
    done: dict[int, Any] = {}
    for sub in model.modules():
        for store, is_param in ((sub._parameters, True), (sub._buffers, False)):
            for key, t in list(store.items()):
                if t is None:
                    continue
                new = done.get(id(t))
                if new is None:
                    d = shard_dim(tuple(t.shape), n) if is_param else None
                    placements = [Shard(d) if i == m.axis_index(axis) and d is not None else Replicate()
                                  for i in range(m.ndim)]
                    new = distribute_tensor(t.detach(), m, placements)
                    new = nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new
                    done[id(t)] = new
                store[key] = new


def _split(x: LazyTensor, m: Any, placements: list) -> LazyTensor:
    """Device data (a fresh batch) moves to its shards now, so the program gets a committed
    input; a computed value gets a sharding constraint."""
    if not is_view(x) and storage_of(x).value.op == DATA and not x.requires_grad:
        return distribute_tensor(x, m, placements)
    return constrain_activation(x, m, placements)
