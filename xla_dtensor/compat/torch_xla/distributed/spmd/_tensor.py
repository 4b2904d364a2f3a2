"""torch_xla's ``XLAShardedTensor`` and ``XLAShard`` over this project's sharded tensor.

The class derives from :class:`xla_dtensor.spmd.XLAShardedTensor` (ops, layouts and the
DTensor surface are that class's) and adds torch_xla's behaviour: a constructor taking
the tensor to wrap, ``global_tensor`` being that tensor itself (its ``requires_grad`` and
autograd history kept), and ``local_shards`` padded to one size, as the devices hold them,
with ``unpadded_data`` for the logical piece.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.compat.torch_xla.distributed.spmd import Mesh, mark_sharding
    >>> t = torch.arange(7.).to(xla_dtensor.device())
    >>> st = mark_sharding(t, Mesh(range(8), (8,)), (0,))
    >>> [tuple(s.data.shape) for s in st.local_shards][-1], st.local_shards[-1].unpadded_data.numel()
    ((1,), 0)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xla_dtensor.core.tensor import LazyTensor, wrap_like
from xla_dtensor.spmd.annotate import _require_lazy
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor as _Sharded

__all__ = ["XLAShard", "XLAShardedTensor", "unwrap_sharded_tensor", "wrap_as_sharded_tensor", "wrap_if_sharded"]


@dataclass
class XLAShard:
    """One device's piece as the device holds it: ``data`` padded to the common shard shape,
    ``indices`` into the global tensor, ``shard_device`` (``"xla:<id>"``) and ``replica_id``."""

    data: torch.Tensor
    indices: tuple[slice, ...]
    shard_device: str
    replica_id: int

    @property
    def unpadded_data(self) -> torch.Tensor:
        """``data`` without the padding: the piece of the global tensor at ``indices``."""
        return self.data[tuple(slice(0, s.stop - s.start) for s in self.indices)]


class XLAShardedTensor(_Sharded):
    """``XLAShardedTensor(t)``: ``t`` (a ``jax`` tensor) seen with its layout; see the module doc.

    ``mesh_shape`` / ``partition_spec`` are accepted and ignored: the layout is the one
    ``t`` has (annotate with ``mark_sharding``).
    """

    @staticmethod
    def __new__(cls, elem: torch.Tensor, mesh_shape: Any = None, partition_spec: Any = None, *,
                requires_grad: bool = False) -> XLAShardedTensor:
        t = _require_lazy(elem, "XLAShardedTensor")
        out = wrap_like(cls, t, requires_grad=requires_grad)
        out._source = t
        return out

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    @property
    def global_tensor(self) -> LazyTensor:
        """The tensor this one wraps (same storage; its ``requires_grad`` and history kept)."""
        src = self.__dict__.get("_source")
        return src if src is not None else _Sharded.global_tensor.fget(self)  # type: ignore[attr-defined]

    @property
    def local_shards(self) -> list[XLAShard]:  # type: ignore[override]
        """Each addressable device's piece, zero-padded to the largest piece's shape."""
        shards = _Sharded.local_shards.fget(self)  # type: ignore[attr-defined]
        size = [max(s.data.shape[d] for s in shards) for d in range(self.dim())]
        out = []
        for s in shards:
            data = s.data
            if list(data.shape) != size:
                data = torch.zeros(size, dtype=s.data.dtype)
                data[tuple(slice(0, n) for n in s.data.shape)] = s.data
            out.append(XLAShard(data, s.indices, f"xla:{s.device_id}", s.replica_id))
        return out

    @property
    def sharding_type(self) -> Any:
        """torch_xla's ``ShardingType`` of the layout."""
        from xla_dtensor.compat.torch_xla.distributed.spmd._annotate import sharding_type_of
        return sharding_type_of(self.sharding_spec)


def wrap_as_sharded_tensor(t: torch.Tensor) -> XLAShardedTensor:
    """``t`` as an :class:`XLAShardedTensor` (``t`` itself when it is one)."""
    return t if isinstance(t, XLAShardedTensor) else XLAShardedTensor(t)


def unwrap_sharded_tensor(t: torch.Tensor) -> torch.Tensor:
    """The plain tensor behind a sharded one (``t`` itself otherwise)."""
    return t.global_tensor if isinstance(t, _Sharded) else t


def wrap_if_sharded(x: Any) -> Any:
    """``x`` wrapped when it is a ``jax`` tensor someone annotated, else ``x`` unchanged."""
    from xla_dtensor.spmd.annotate import sticky_spec
    if isinstance(x, LazyTensor) and not isinstance(x, _Sharded) and sticky_spec(x) is not None:
        return XLAShardedTensor(x)
    return x
