"""``mark_sharding_with_gradients``: annotate a value and its gradient alike (torch_xla 8678)."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from xla_dtensor.core.tensor import LazyTensor, meta_of, new_tensor, value_of
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A
from xla_dtensor.core import layout as L


def mark_sharding_with_gradients(t: Any, mesh: Any, partition_spec: Sequence[Any]) -> torch.Tensor:
    """A differentiable copy of ``t`` constrained to ``partition_spec``; its gradient gets
    the same constraint in the backward pass. Use the returned tensor downstream.

    Example:
        >>> import torch, xla_dtensor
        >>> from xla_dtensor.spmd import Mesh, mark_sharding_with_gradients
        >>> x = torch.ones(8, 2, device=xla_dtensor.device(), requires_grad=True)
        >>> y = mark_sharding_with_gradients(x, Mesh(range(8), (8,), ("x",)), ("x", None))
        >>> y.sum().backward(); x.grad.shape
        torch.Size([8, 2])
    """
    t = A._require_lazy(t, "mark_sharding_with_gradients")
    spec = ShardingSpec.from_partition_spec(A.as_mesh(mesh), partition_spec, ndim=t.dim())
    return _ShardBoth.apply(t, L.named(spec))


class _ShardBoth(torch.autograd.Function):
    # NOTE: nothing here may raise in backward (an exception there aborts the process)
    @staticmethod
    def forward(ctx: Any, x: LazyTensor, sharding: Any) -> LazyTensor:  # noqa: ANN401
        ctx.sharding = sharding
        return new_tensor(meta_of(x), L.constrain(value_of(x), sharding))

    @staticmethod
    def backward(ctx: Any, grad: Any) -> tuple[Any, None]:
        if isinstance(grad, LazyTensor):
            grad = new_tensor(meta_of(grad), L.constrain(value_of(grad), ctx.sharding))
        return grad, None
