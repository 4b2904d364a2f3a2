"""``XLAShardedTensor``: a DTensor-compatible view of a lazy tensor and its layout.

Design: an ``XLAShardedTensor`` IS a :class:`~xla_dtensor.core.LazyTensor`. It shares
the storage cell (and view chain) of the tensor it wraps, so it takes part in every
lazy op like any device tensor, and in-place updates through either object are seen by
both. Its layout is not stored on the object: it is read from the storage (the
user's annotation, else the propagated sharding of the data after ``sync()``), see
:mod:`xla_dtensor.spmd.annotate`. Ops on it return ``XLAShardedTensor`` s (as
torch_xla's does), whose layout is what XLA propagates.

Values are global: shapes, ``full_tensor()`` and every op see the logical tensor; the
per-device pieces are ``local_shards``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import jax
import numpy as np
import torch

from mesh import Mesh
from xla_dtensor.core.tensor import LazyTensor, new_tensor, value_of
from xla_dtensor.sharding import ShardingSpec, shard_indices
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd import layout as L
from xla_dtensor.spmd.errors import MeshDevicesError

_new = torch.Tensor._make_wrapper_subclass


@dataclass(frozen=True)
class XLAShard:
    """One device's piece: ``data`` (CPU copy), its ``indices`` in the global tensor,
    the ``device_id`` holding it and its ``replica_id`` (0 for the first copy)."""

    data: torch.Tensor
    indices: tuple[slice, ...]
    device_id: int
    replica_id: int


class XLAShardedTensor(LazyTensor):
    """A lazy tensor with a layout on a device mesh; see the module doc.

    Example:
        >>> import torch, xla_dtensor
        >>> from torch.distributed.tensor import Shard
        >>> from torch.distributed.device_mesh import DeviceMesh
        >>> d = xla_dtensor.distribute_tensor(torch.arange(8.), DeviceMesh("xla", list(range(4))), [Shard(0)])
        >>> d.placements, [s.indices for s in d.local_shards][1]
        ((Shard(dim=0),), (slice(2, 4, None),))
    """

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        from xla_dtensor.core.dispatch import dispatch
        return _rewrap(dispatch(func, args, kwargs or {}))

    @staticmethod
    def wrap(t: LazyTensor) -> XLAShardedTensor:
        """``t`` seen as an ``XLAShardedTensor`` (same storage; ``t`` itself if it is one).

        For a tensor that requires grad the result is a differentiable alias, so
        gradients reach ``t``.
        """
        if isinstance(t, XLAShardedTensor):
            return t
        if t.requires_grad:
            return _AsSharded.apply(t)
        return _wrap_plain(t)

    # -- layout ---------------------------------------------------------------------
    @property
    def spec(self) -> ShardingSpec | None:
        """The layout as a :class:`ShardingSpec` (``None`` while XLA has not decided it)."""
        return A.get_spec(self)

    def _known_spec(self) -> ShardingSpec:
        spec = self.spec
        if spec is None:
            from xla_dtensor.core.executor import sync
            sync()
            spec = self.spec
        if spec is None:  # a single-device array
            import jax as _jax
            return ShardingSpec.replicated(Mesh([_jax.devices()[0].id], (1,)), self.dim())
        return spec

    @property
    def sharding_spec(self) -> str:
        """The HLO sharding string (device ids); runs pending work if the layout is undecided."""
        return str(self._known_spec().reduced().on_root().to_hlo())

    @property
    def partition_spec(self) -> tuple[Any, ...]:
        """The torch_xla partition spec on :attr:`mesh`."""
        return self._known_spec().reduced().to_partition_spec()

    @property
    def mesh(self) -> Mesh:
        """The :class:`mesh.Mesh` of the layout."""
        return self._known_spec().mesh

    @property
    def placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh axis (``Partial`` is materialized: ``Replicate``)."""
        return self._known_spec().reduced().to_placements()

    @property
    def device_mesh(self) -> Any:
        """The layout's mesh as a torch ``DeviceMesh("xla", ...)``."""
        from torch.distributed.device_mesh import DeviceMesh
        m = self.mesh
        return DeviceMesh("xla", m.get_logical_mesh().tolist(), mesh_dim_names=m.axis_names)

    @property
    def global_tensor(self) -> LazyTensor:
        """A plain lazy tensor sharing this one's storage."""
        from xla_dtensor.core.tensor import new_view
        return new_view(self._meta, self._storage, self._chain, value_of(self))

    # -- values ---------------------------------------------------------------------
    def full_tensor(self) -> LazyTensor:
        """The whole tensor, replicated on every device of the mesh (lazy)."""
        spec = ShardingSpec.replicated(self._known_spec().mesh, self.dim())
        return _Relayout.apply(self, spec, False)

    def redistribute(self, device_mesh: Any = None, placements: Sequence[Any] | None = None) -> XLAShardedTensor:
        """A new tensor with the same value laid out by ``placements`` on ``device_mesh``.

        ``Partial`` placements are pending reductions: the value is reduced (it already
        is, globally) and those mesh axes hold replicas.

        Raises:
            MeshDevicesError: ``device_mesh`` has other devices than the current mesh.
        """
        current = self._known_spec().mesh
        m = current if device_mesh is None else A.as_mesh(device_mesh)
        if sorted(m.root.device_ids) != sorted(current.root.device_ids):
            raise MeshDevicesError(
                f"redistribute cannot move data to other devices: the tensor is on devices "
                f"{sorted(current.root.device_ids)} but the target mesh {m!r} has "
                f"{sorted(m.root.device_ids)}; distribute a copy (distribute_tensor) instead")
        from torch.distributed.tensor.placement_types import Replicate
        placements = placements if placements is not None else [Replicate()] * m.ndim
        spec = ShardingSpec.from_placements(m, placements, self.dim())
        return _Relayout.apply(self, spec, True)

    @property
    def local_shards(self) -> list[XLAShard]:
        """Each addressable device's piece with its global index range and replica id."""
        from xla_dtensor.core.executor import materialize
        spec = self._known_spec()
        v = value_of(self)
        src = L.padded_source(v)
        arr = src.data if src is not None else materialize(self)
        if not isinstance(arr, jax.Array):
            arr = jax.device_put(arr)
        want = shard_indices(spec.reduced().on_root(), self.shape)
        shards = []
        for sh in sorted(arr.addressable_shards, key=lambda s: s.device.id):
            idx = want.get(sh.device.id)
            if idx is None:
                idx = tuple(slice(0, n) for n in self.shape)
            data = np.asarray(sh.data)[tuple(slice(0, i.stop - i.start) for i in idx)]
            shards.append(XLAShard(_to_torch(data, self.dtype), idx, sh.device.id, sh.replica_id))
        return shards

    def to_local(self) -> torch.Tensor:
        """The shard of this process's first device (a CPU tensor, like a rank's local tensor)."""
        return self.local_shards[0].data

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # must never fail (torch_xla 5798)
        try:
            body = LazyTensor.__repr__(self)
        except Exception as e:  # noqa: BLE001
            body = f"<values unavailable: {type(e).__name__}: {e}>"
        try:
            spec = A.get_spec(self)
            layout = "pending" if spec is None else str(spec.reduced().on_root().to_hlo())
        except Exception as e:  # noqa: BLE001
            layout = f"<unavailable: {type(e).__name__}>"
        return (f"XLAShardedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
                f"sharding={layout}, global_tensor={body})")


def _to_torch(arr: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bfloat16:
        return torch.from_numpy(np.asarray(arr, np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(arr))


def _rewrap(x: Any) -> Any:
    if type(x) is LazyTensor:
        return XLAShardedTensor.wrap(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_rewrap(y) for y in x)
    return x


def _wrap_plain(t: LazyTensor) -> XLAShardedTensor:
    """A new ``XLAShardedTensor`` object over ``t``'s storage (no autograd history)."""
    shape, dtype, stride = t._meta
    out = _new(XLAShardedTensor, shape, strides=stride, dtype=dtype, device=t.device)
    out._storage, out._chain, out._meta = t._storage, t._chain, t._meta
    if t._chain:
        out._vcache, out._seen = value_of(t), t._seen
        entry = A._VIEW_SPECS.get(id(t))
        if entry is not None and entry[0]() is t:
            import weakref
            A._VIEW_SPECS[id(out)] = (weakref.ref(out, A._forget(id(out))), entry[1], entry[2])
    return out


class _AsSharded(torch.autograd.Function):
    """Differentiable alias: forward wraps, backward passes the gradient through."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor) -> XLAShardedTensor:  # noqa: ANN401
        return _wrap_plain(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


class _Relayout(torch.autograd.Function):
    """Differentiable re-layout: a new tensor with ``x``'s value laid out as ``spec``."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor, spec: ShardingSpec, sharded: bool) -> LazyTensor:  # noqa: ANN401
        if not sharded:
            return new_tensor(x._meta, L.constrain(value_of(x), L.named(spec)))
        out = new_tensor(x._meta, value_of(x))
        A.apply_spec(out, spec)
        return _wrap_plain(out)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return grad, None, None
