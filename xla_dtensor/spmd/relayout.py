"""Layout changes that autograd sees: the one primitive behind ``from_local``,
``redistribute``, ``to_local`` and the translated torch parallel styles.

Under single-controller SPMD a layout change never changes a value, only where its
pieces live. So every DTensor-style conversion on a lazy tensor is a *sharding
constraint* on the global value, applied in the next program (device data included),
and XLA inserts the collectives (all-gather, reduce-scatter, all-reduce, all-to-all)
between the layouts it is given.

The backward pass gets a layout too, as in DTensor: the gradient of a relayout from
``src`` to ``dst`` is constrained to ``src`` (a ``Partial`` source to ``Replicate``),
so a sequence-parallel forward (reduce-scatter, all-gather) has the mirrored backward.

What a constraint pins (:func:`constraint_for`):

* every tensor dim a placement shards is split exactly as it says;
* on a sub-mesh (``mesh["tp"]``) the dims the placements leave whole are left to the
  partitioner (``UNCONSTRAINED``) when the root has other axes larger than 1, so a batch
  split on ``"dp"`` survives a ``Replicate()`` on ``"tp"``;
* a ``Partial`` axis is a pending reduction: nothing forces the reduction there; the
  next layout that needs the reduced value makes XLA reduce (an all-reduce for
  ``Replicate``, a reduce-scatter for ``Shard``). Dims left whole are ``UNCONSTRAINED``.
"""
from __future__ import annotations

import functools

from typing import Any

import jax
import torch

from xla_dtensor.core.ir import DATA
from xla_dtensor.core.tensor import LazyTensor, chain_of, meta_of, new_tensor, new_view, storage_of, value_of
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.core import layout as L

_P = jax.sharding.PartitionSpec


# NOTE: cached: AUTO's input hook and every Relayout's backward ask each step, and a new NamedSharding per
# call also missed layout.constraint_key's cache (hashing one runs Python)
@functools.lru_cache(maxsize=4096)
def constraint_for(spec: ShardingSpec) -> jax.sharding.NamedSharding | None:
    """The sharding constraint that lays a pending value out as ``spec``.

    ``None`` when ``spec`` pins nothing (say ``Partial()`` on a 1-D mesh).

    Example:
        >>> from mesh import Mesh
        >>> from torch.distributed.tensor import Shard
        >>> m = Mesh(range(8), (2, 4), ("dp", "tp"))
        >>> constraint_for(ShardingSpec.from_placements(m["tp"], [Shard(1)], 3)).spec
        P(UNCONSTRAINED, 'tp', UNCONSTRAINED)
    """
    root = spec.reduced().on_root()
    pspec = list(root.to_jax_pspec()) + [None] * (spec.ndim - len(root.to_jax_pspec()))
    if _leaves_whole_dims_free(spec):
        if all(e is None for e in pspec):
            return None
        pspec = [_P.UNCONSTRAINED if e is None else e for e in pspec]
    return jax.sharding.NamedSharding(root.mesh.jax_mesh(), _P(*pspec))


def _leaves_whole_dims_free(spec: ShardingSpec) -> bool:
    if spec.is_partial:
        return True
    m = spec.mesh
    inside = {a for g in m.root_axis_groups for a in g}
    return any(n > 1 for a, n in enumerate(m.root.mesh_shape) if a not in inside)


def grad_spec_of(spec: ShardingSpec | None) -> ShardingSpec | None:
    """The layout a gradient flowing back to ``spec`` gets: ``Partial`` axes replicated."""
    return None if spec is None else spec.reduced()


def laid_out(x: LazyTensor, spec: ShardingSpec) -> Any:
    """``x``'s value constrained to ``spec`` (left alone when ``spec`` pins nothing).

    NOTE: device data is not moved now but constrained in the next program: a move made
    while ``xla_dtensor.compile`` traces a step would be baked into the replay as a
    constant (the first batch's tokens, say), not redone for each call's arguments. Only
    data on the same devices in another order moves now (one program cannot hold both).
    """
    v = value_of(x)
    if v.op == DATA and isinstance(v.data, jax.Array) and _device_order(v.data) != spec.mesh.root.device_ids:
        return L.reshard(v, tuple(x.shape), x.dtype, spec.reduced())
    sharding = constraint_for(spec)
    return v if sharding is None else L.constrain(v, sharding)


def _device_order(arr: jax.Array) -> tuple[int, ...]:
    return tuple(d.id for d in arr.sharding._device_assignment)


def _constrain_grad(grad: torch.Tensor | None, spec: ShardingSpec | None) -> torch.Tensor | None:
    if grad is None or spec is None or not isinstance(grad, LazyTensor):
        return grad
    sharding = constraint_for(spec)
    if sharding is None:
        return grad
    return new_tensor(meta_of(grad), L.constrain(value_of(grad), sharding))


class Relayout(torch.autograd.Function):
    """``x`` laid out as ``spec``; the gradient laid out as ``grad_spec`` (``None``: free)."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor, spec: ShardingSpec, grad_spec: ShardingSpec | None) -> LazyTensor:  # noqa: ANN401
        ctx.grad_spec = grad_spec
        return new_tensor(meta_of(x), laid_out(x, spec))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        return _constrain_grad(grad, ctx.grad_spec), None, None


class Recompute(torch.autograd.Function):
    """``x`` whose value is ``value``: the same value computed another way (say a row-split
    product as a local product and a reduce-scatter), already laid out. Autograd keeps
    ``x``'s history; the gradient is laid out as ``grad_spec``."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor, value: Any, grad_spec: ShardingSpec | None) -> LazyTensor:  # noqa: ANN401
        ctx.grad_spec = grad_spec
        return new_tensor(meta_of(x), value)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None, None]:
        return _constrain_grad(grad, ctx.grad_spec), None, None


class Alias(torch.autograd.Function):
    """A plain :class:`LazyTensor` sharing ``x``'s storage (in-place writes reach both);
    the gradient is laid out as ``grad_spec``."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor, grad_spec: ShardingSpec | None) -> LazyTensor:  # noqa: ANN401
        ctx.grad_spec = grad_spec
        return new_view(meta_of(x), storage_of(x), chain_of(x), value_of(x))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, None]:
        return _constrain_grad(grad, ctx.grad_spec), None


class HostGrad(torch.autograd.Function):
    """``placed`` (a device copy of the CPU tensor ``host``) with the gradient routed
    back to ``host`` as a CPU tensor, so ``from_local`` of a CPU leaf stays differentiable."""

    @staticmethod
    def forward(ctx: Any, host: torch.Tensor, placed: LazyTensor) -> LazyTensor:  # noqa: ANN401
        return placed.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.cpu(), None
