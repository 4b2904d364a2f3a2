"""``torch_xla.experimental.spmd_fully_sharded_data_parallel``: FSDPv2 by sharding annotations.

:class:`SpmdFullyShardedDataParallel` shards each parameter's largest dim (the first of
equal ones, even when uneven) over the mesh axis ``"fsdp"`` and each input's and output's
batch dim (dim 0) over ``"fsdp"`` (or over ``(extra_data_axis, "fsdp")``); a parameter
that already has an annotation keeps it. XLA inserts the all-gathers and reduce-scatters.
``auto_wrap_policy`` (torch FSDP's policies: ``(module, recurse, nonwrapped_numel)``)
picks sub-modules to wrap on their own, with ``auto_wrapper_callable(module, *a, **kw)``
(default: this class) doing the wrapping.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.compat.torch_xla.distributed.spmd import Mesh, get_sharding_spec
    >>> mesh = Mesh(range(8), (8, 1), ("fsdp", "model"))
    >>> m = SpmdFullyShardedDataParallel(torch.nn.Linear(16, 4), mesh=mesh)
    >>> get_sharding_spec(m.module.weight)
    '{devices=[1,8]<=[8]}'
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from xla_dtensor.compat.torch_xla.distributed.spmd._annotate import mark_sharding
from xla_dtensor.core import device as _device
from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.spmd import annotate as _A
from xla_dtensor.spmd.module import constrain_activation

__all__ = ["SpmdFullyShardedDataParallel"]


def _batch_spec(x: torch.Tensor, extra: str | None) -> tuple[Any, ...]:
    first: Any = (extra, "fsdp") if extra else "fsdp"
    return (first,) + (None,) * (x.dim() - 1)


def _shard_batch(x: Any, mesh: Any, extra: str | None) -> Any:
    if not isinstance(x, LazyTensor) or x.dim() == 0:
        return x
    from xla_dtensor.sharding import ShardingSpec
    spec = ShardingSpec.from_partition_spec(mesh, _batch_spec(x, extra), ndim=x.dim())
    return constrain_activation(x, mesh, list(spec.to_placements()))


class SpmdFullyShardedDataParallel(nn.Module):
    """FSDPv2 over a mesh with an ``"fsdp"`` axis; see the module doc.

    Args:
        module: the model (moved to the ``jax`` device).
        mesh: the mesh (default: the global mesh).
        shard_output: ``(output, mesh) -> None`` annotating the output; default: a tensor
            output (or the first of a tuple) gets its batch dim sharded.
        auto_wrap_policy: torch FSDP wrap policy choosing sub-modules to wrap.
        auto_wrapper_callable: wraps a chosen sub-module (default: this class).
        extra_data_axis: a second mesh axis the batch is split over (data parallel).

    Raises:
        ValueError: the mesh has no ``"fsdp"`` axis or no ``extra_data_axis`` axis.
    """

    def __init__(self, module: nn.Module, *, mesh: Any = None, shard_output: Callable[..., None] | None = None,
                 auto_wrap_policy: Callable[..., bool] | None = None,
                 auto_wrapper_callable: Callable[..., nn.Module] | None = None,
                 extra_data_axis: str | None = None) -> None:
        super().__init__()
        m = _A.as_mesh(mesh)
        names = list(m.axis_names or ())
        for axis in ("fsdp", extra_data_axis):
            if axis is not None and axis not in names:
                raise ValueError(f"FSDPv2 needs a mesh axis {axis!r}; the mesh has axes {names}")
        self._mesh, self._shard_output, self._extra = m, shard_output, extra_data_axis
        if auto_wrap_policy is not None:
            wrap = auto_wrapper_callable or (lambda mod, *a, **kw: SpmdFullyShardedDataParallel(
                mod, mesh=m, extra_data_axis=extra_data_axis))
            _wrap_children(module, auto_wrap_policy, wrap)
        module.to(_device())
        for p in module.parameters():
            if getattr(p, "_fsdpv2_sharded", False) or (isinstance(p, LazyTensor) and _A.sticky_spec(p) is not None):
                continue  # wrapped by an inner FSDPv2, or annotated by the user: kept (torch_xla)
            # NOTE: torch_xla's rule: the first largest dim, even when uneven (XLA pads)
            d = max(range(p.dim()), key=lambda i: p.shape[i]) if p.dim() else None
            if d is not None:
                mark_sharding(p.data, m, tuple("fsdp" if i == d else None for i in range(p.dim())), overwrite=True)
            p._fsdpv2_sharded = True
        self._fsdp_wrapped_module = module

    @property
    def module(self) -> nn.Module:
        """The wrapped model."""
        return self._fsdp_wrapped_module

    def __getattr__(self, name: str) -> Any:
        """Attributes the wrapper lacks come from the wrapped model (as in torch_xla)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "_fsdp_wrapped_module":
                raise
            return getattr(self.module, name)

    def __getitem__(self, key: int) -> nn.Module:
        """Indexing goes to the wrapped model (an ``nn.Sequential``)."""
        return self.module[key]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(_shard_batch(a, self._mesh, self._extra) for a in args)
        kwargs = {k: _shard_batch(v, self._mesh, self._extra) for k, v in kwargs.items()}
        out = self.module(*args, **kwargs)
        if self._shard_output is not None:
            self._shard_output(out, self._mesh)
            return out
        if isinstance(out, LazyTensor):
            return _shard_batch(out, self._mesh, self._extra)
        if isinstance(out, tuple) and out and isinstance(out[0], LazyTensor):
            return (_shard_batch(out[0], self._mesh, self._extra),) + out[1:]
        return out


def _numel(mod: nn.Module) -> int:
    return sum(p.numel() for p in mod.parameters())


def _wrap_children(module: nn.Module, policy: Callable[..., bool], wrap: Callable[..., nn.Module]) -> None:
    """Wrap, innermost first, every sub-module ``policy`` picks (the root is wrapped by the caller)."""
    for name, child in list(module.named_children()):
        if policy(module=child, recurse=True, nonwrapped_numel=_numel(child)):
            _wrap_children(child, policy, wrap)
        if policy(module=child, recurse=False, nonwrapped_numel=_numel(child)):
            setattr(module, name, wrap(child))
