"""Program-shaping calls of torch_xla's SPMD API: ``shard_as``, the backward optimization
barrier, and the manual-sharding pair (not provided: see :func:`enable_manual_sharding`).

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.compat.torch_xla.distributed.spmd import Mesh, mark_sharding, get_sharding_spec
    >>> a = torch.zeros(8, 8).to(xla_dtensor.device()); b = torch.ones(8, 8).to(xla_dtensor.device())
    >>> _ = mark_sharding(a, Mesh(range(8), (8,)), (0, None))
    >>> _, b2 = shard_as(a, b)
    >>> get_sharding_spec(b2)
    '{devices=[8,1]<=[8]}'
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import torch
from torch import nn

from xla_dtensor.core.ir import getitem, make_node
from xla_dtensor.core.tensor import LazyTensor, meta_of, new_tensor, value_of
from xla_dtensor.spmd import annotate as _A
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor as _Sharded

__all__ = ["ManualShardingError", "_mark_manual_sharding", "apply_backward_optimization_barrier",
           "disable_manual_sharding",
           "enable_manual_sharding", "optimization_barrier_", "shard_as"]

_BARRIER = "optimization_barrier"


class ManualShardingError(NotImplementedError):
    """Manual sharding regions (per-device shapes inside one lazy program) are not provided."""


_MANUAL_HINT = (
    "manual sharding (torch_xla's enable_manual_sharding/disable_manual_sharding) is not provided: a "
    "single-controller lazy tensor always has its global shape. Write the region on global tensors and "
    "annotate it (mark_sharding / xla_dtensor.spmd.constrain_activation: XLA partitions it), or run the "
    "per-device code as a JAX shard_map; see docs/migrating_from_torch_xla.md")


def enable_manual_sharding(t: torch.Tensor, partition_spec: Sequence[Any], *, mesh: Any = None) -> Any:
    """Not provided; raises :class:`ManualShardingError` naming the alternatives."""
    raise ManualShardingError(_MANUAL_HINT)


def disable_manual_sharding(t: torch.Tensor, partition_spec: Sequence[Any], full_shape: Any, *,
                            mesh: Any = None) -> Any:
    """Not provided; raises :class:`ManualShardingError` naming the alternatives."""
    raise ManualShardingError(_MANUAL_HINT)


def _mark_manual_sharding(t: torch.Tensor, mesh: Any = None) -> Any:
    """Not provided; raises :class:`ManualShardingError` naming the alternatives."""
    raise ManualShardingError(_MANUAL_HINT)


def _layout(t: LazyTensor) -> Any:
    return _Sharded.wrap(t.detach())._known_spec()


def shard_as(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a, b)`` laid out alike: ``b`` takes ``a``'s layout when ``a`` is split, else ``a``
    takes ``b``'s (a pending value's layout is what XLA propagates; it is computed first).

    Raises:
        ValueError: the two shapes differ.
    """
    if tuple(a.shape) != tuple(b.shape):
        raise ValueError(f"shard_as needs two tensors of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    a, b = _A._require_lazy(a, "shard_as"), _A._require_lazy(b, "shard_as")
    spec_a = _layout(a)
    src, dst = (a, b) if not spec_a.is_replicated else (b, a)
    spec = spec_a if src is a else _layout(b)
    _A.apply_spec(dst, spec)
    return a, b


def _barrier_fn(*xs: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(jax.lax.optimization_barrier(xs))


def optimization_barrier_(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """The ``jax`` tensors of ``tensors`` passed through one XLA optimization barrier (new
    tensors, same values): XLA may not move computation across it, nor fuse through it."""
    lazy = [t for t in tensors if isinstance(t, LazyTensor)]
    if not lazy:
        return list(tensors)
    key = (_BARRIER, tuple(meta_of(t) for t in lazy))
    node = make_node(_BARRIER, key, hash(key), tuple(value_of(t) for t in lazy), _barrier_fn)
    it = iter(new_tensor((tuple(t.shape), t.dtype, torch.empty(t.shape, device="meta").stride()), getitem(node, i))
              for i, t in enumerate(lazy))
    return [next(it) if isinstance(t, LazyTensor) else t for t in tensors]


def apply_backward_optimization_barrier(m: nn.Module) -> None:
    """Put an optimization barrier on ``m``'s output gradients in the backward pass, so XLA
    does not hoist the module's backward computation (say, a rematerialized forward) above
    the gradient arriving from later layers (torch_xla's memory-saving use).

    Example:
        >>> import torch, xla_dtensor
        >>> lin = torch.nn.Linear(4, 4).to(xla_dtensor.device())
        >>> apply_backward_optimization_barrier(lin)
        >>> lin(torch.ones(2, 4).to(xla_dtensor.device())).sum().backward()
        >>> "opt-barrier" in xla_dtensor.get_hlo([lin.weight.grad])
        True
    """
    def hook(module: nn.Module, grad_output: tuple) -> tuple:
        return tuple(optimization_barrier_(list(grad_output)))
    m.register_full_backward_pre_hook(hook)
