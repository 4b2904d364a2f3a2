"""``XLAShardedTensor``: a DTensor-compatible view of a lazy tensor and its layout.

Design: an ``XLAShardedTensor`` IS a :class:`~xla_dtensor.core.LazyTensor`. It shares
the storage cell (and view chain) of the tensor it wraps, so it takes part in every
lazy op like any device tensor, and in-place updates through either object are seen by
both. Its layout is read from the storage (the user's annotation, else the propagated
sharding of the data after ``sync()``), see :mod:`xla_dtensor.spmd.annotate`, except
for a tensor made by ``from_local`` / ``redistribute`` / ``distribute_tensor``, which
also remembers the placements it was given (``Partial`` included) until it is written
in place. Ops on it return ``XLAShardedTensor`` s (as torch_xla's does), whose layout
is what XLA propagates.

It is also a :class:`torch.distributed.tensor.DTensor` (a subclass, second base after
``LazyTensor``), so torch's DTensor-aware code (``clip_grad_norm_``, DCP's planners,
``get_state_dict``) takes its DTensor path. NOTE: every DTensor method torch's code calls
resolves here first (``LazyTensor`` comes first in the MRO): ``__torch_dispatch__``
records lazy ops (torch's DTensor dispatcher and its C++ fast path never see our
tensors), and ``_spec`` / ``_local_tensor`` are computed from the layout (DTensor's
slots stay unset).

Single-controller semantics (one program for every device; see docs/spmd.md):

* Values are global: shapes, ``full_tensor()`` and every op see the logical tensor; the
  per-device pieces are ``local_shards``.
* ``from_local(t, mesh, placements)``: ``t`` is the value the program holds, so it is the
  global value (for ``Partial``: the reduced value); ``placements`` say how it is laid
  out. ``to_local()`` is its inverse: the same global value as a plain lazy tensor.
* ``Partial`` is a pending reduction: ``placements`` reports it, and the reduction
  happens where a later layout needs the reduced value (all-reduce or reduce-scatter).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import numpy as np
import torch
from torch.distributed.tensor import DTensor

from mesh import Mesh
from xla_dtensor.core import threads
from xla_dtensor.core.tensor import OUT as _OUT, chain_of, is_view, meta_of, storage_of, wrap_like
from xla_dtensor.core.tensor import LazyTensor, direct_subclass, value_of
from xla_dtensor.sharding import ShardingSpec, shard_indices
from xla_dtensor.spmd import annotate as A
from xla_dtensor.core import layout as L
from xla_dtensor.spmd import relayout as R
from xla_dtensor.spmd.errors import MeshDevicesError, TorchVersionError

_LAZY_DISPATCH = LazyTensor.__torch_dispatch__.__func__
_LOCK = threads.LOCK

_new = torch.Tensor._make_wrapper_subclass


@dataclass(frozen=True)
class XLAShard:
    """One device's piece: ``data`` (CPU copy), its ``indices`` in the global tensor,
    the ``device_id`` holding it and its ``replica_id`` (0 for the first copy)."""

    data: torch.Tensor
    indices: tuple[slice, ...]
    device_id: int
    replica_id: int


class XLAShardedTensor(LazyTensor, DTensor):
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
        if func is _EMPTY_LIKE or func is _COPY:  # layout-keeping allocation and shard-by-shard host copies
            res = _keep_layout(func, args, kwargs or {})
            if res is not None:
                return res
        out = _OUT
        with _LOCK:  # NOTE: out.cls is the core's: set under its lock, which the lazy entry takes again
            prev, out.cls = out.cls, XLAShardedTensor  # new results are made sharded tensors at once
            try:  # the lazy tensor's entry: the owning thread, errors raised in backward
                res = _LAZY_DISPATCH(cls, func, types, args, kwargs)
            finally:
                out.cls = prev
        return res if type(res) is XLAShardedTensor else _rewrap(res)  # a plain input returned (in-place ops)

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

    def __tensor_flatten__(self) -> tuple[list[str], Any]:
        from torch._guards import TracingContext
        if TracingContext.try_get() is not None:  # NOTE: dynamo takes every DTensor for torch's own
            raise TypeError(
                "torch.compile cannot take an XLAShardedTensor (a DTensor) as an input; pass its "
                "global_tensor (the same data and layout, a plain jax tensor) or the tensor mark_sharding "
                "annotated: the compiled program keeps the sharding")
        return LazyTensor.__tensor_flatten__(self)

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
        if spec is None and is_view(self):  # a view (say a gradient torch transposed twice): its array's layout
            from xla_dtensor.core.executor import materialize
            arr = materialize(self)
            if isinstance(arr, jax.Array):
                spec = A._spec_of_array(arr, self.dim())
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
        """DTensor placements, one per mesh axis: the ones this tensor was made with
        (``Partial`` included), else the propagated layout (runs pending work if undecided)."""
        spec = self._recorded()
        return (spec if spec is not None else self._known_spec().reduced()).to_placements()

    @property
    def device_mesh(self) -> Any:
        """The layout's mesh as a torch ``DeviceMesh("xla", ...)`` (the one given, if any)."""
        given = getattr(self, "_dt_mesh_arg", None)
        if given is not None and self._recorded() is not None and hasattr(given, "device_type"):
            return given
        from torch.distributed.device_mesh import DeviceMesh
        m = self.mesh
        return DeviceMesh("xla", m.get_logical_mesh().tolist(), mesh_dim_names=m.axis_names)

    @property
    def _spec(self) -> Any:
        """torch's ``DTensorSpec`` of this tensor (mesh, placements, global shape, stride, dtype)."""
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
        meta = TensorMeta(self.shape, self.stride(), self.dtype)
        return DTensorSpec(self.device_mesh, tuple(self.placements), tensor_meta=meta)

    @_spec.setter
    def _spec(self, value: Any) -> None:
        """Ignored: the spec is derived from the layout (``torch.utils.swap_tensors`` swaps
        DTensor's slots by assignment)."""

    @property
    def _local_tensor(self) -> LazyTensor:
        """DTensor's local tensor: under single-controller SPMD the global value (see ``to_local``),
        a plain lazy tensor sharing the storage, without autograd history."""
        return self.global_tensor

    @_local_tensor.setter
    def _local_tensor(self, value: Any) -> None:
        """Ignored, as for ``_spec``."""

    def _recorded(self) -> ShardingSpec | None:
        """The spec this tensor was made with, while it has not been written in place."""
        spec = getattr(self, "_dt_spec", None)
        if spec is None or getattr(self, "_dt_version", -1) != storage_of(self).version:
            return None
        return spec

    def _record(self, spec: ShardingSpec, mesh_arg: Any) -> XLAShardedTensor:
        self._dt_spec, self._dt_version, self._dt_mesh_arg = spec, storage_of(self).version, mesh_arg
        return self

    @property
    def global_tensor(self) -> LazyTensor:
        """A plain lazy tensor sharing this one's storage."""
        from xla_dtensor.core.tensor import new_view
        return new_view(meta_of(self), storage_of(self), chain_of(self), value_of(self))

    # -- values ---------------------------------------------------------------------
    @staticmethod
    def from_local(local_tensor: torch.Tensor, device_mesh: Any = None,
                   placements: Sequence[Any] | None = None, *, run_check: bool = False,
                   shape: Any = None, stride: Any = None,
                   grad_placements: Sequence[Any] | None = None) -> XLAShardedTensor:
        """``DTensor.from_local`` under single-controller SPMD (``import xla_dtensor`` routes
        torch's own ``DTensor.from_local`` on an ``"xla"`` mesh here).

        There is one program, so the tensor given is the global value (for ``Partial``
        placements: the already-reduced value) and ``placements`` say how it is laid out:
        a lazy tensor gets that layout as a sharding constraint in the next program (differentiable; the
        gradient is laid out as ``grad_placements``, default the same placements with
        ``Partial`` replicated), a CPU tensor is placed shard by shard. Shapes never change.

        Raises:
            RankError: not one placement per mesh axis. PlacementError: ``Shard(d)`` out of range.
            ValueError: ``shape`` differs from the tensor's (a per-device shard cannot be
                given to a single controller: build the global tensor and distribute it).

        Example:
            >>> import torch, xla_dtensor
            >>> from torch.distributed.device_mesh import DeviceMesh
            >>> from torch.distributed.tensor import DTensor, Partial, Shard
            >>> dm = DeviceMesh("xla", list(range(4)))
            >>> x = torch.arange(8.).to(xla_dtensor.device())
            >>> d = DTensor.from_local(x, dm, [Shard(0)])
            >>> tuple(d.shape), d.placements, torch.equal(d.to_local().cpu(), x.cpu())
            ((8,), (Shard(dim=0),), True)
            >>> DTensor.from_local(x, dm, [Partial()]).redistribute(dm, [Shard(0)]).placements
            (Shard(dim=0),)
        """
        del run_check, stride  # one value: nothing to check across ranks, strides are global
        m, mesh_arg = _mesh_of(device_mesh)
        from torch.distributed.tensor.placement_types import Replicate
        placements = list(placements) if placements is not None else [Replicate()] * m.ndim
        spec = ShardingSpec.from_placements(m, placements, local_tensor.dim())
        if shape is not None and tuple(shape) != tuple(local_tensor.shape):
            raise ValueError(
                f"from_local got shape={tuple(shape)} for a tensor of shape {tuple(local_tensor.shape)}: "
                "under single-controller SPMD the tensor given is the global value, not one "
                "device's shard; pass the global tensor (and no shape), or distribute_tensor it")
        grad = spec.reduced() if grad_placements is None else ShardingSpec.from_placements(
            m, list(grad_placements), local_tensor.dim())
        if local_tensor.is_meta:  # a meta module's parameter (SequenceParallel replicates by from_local)
            from xla_dtensor.spmd.api import distribute_tensor
            return distribute_tensor(local_tensor, device_mesh if device_mesh is not None else m, placements)
        if isinstance(local_tensor, LazyTensor):
            out = R.Relayout.apply(local_tensor, spec, grad)
        else:
            from xla_dtensor.spmd.api import distribute_tensor
            placed = distribute_tensor(local_tensor.detach(), m, placements)
            needs_grad = local_tensor.requires_grad and torch.is_grad_enabled()
            out = R.HostGrad.apply(local_tensor, placed) if needs_grad else placed
        return XLAShardedTensor.wrap(out)._record(spec, mesh_arg)

    def to_local(self, *, grad_placements: Sequence[Any] | None = None) -> LazyTensor:
        """The global value as a plain lazy tensor: the inverse of :meth:`from_local`.

        Under single-controller SPMD the program's "local" tensor is the global one (model
        code keeps global shapes), so this shares this tensor's storage (in-place writes
        reach both) and is differentiable; the gradient is laid out as ``grad_placements``
        (default: this tensor's placements, ``Partial`` replicated). For a ``Partial``
        tensor it is the reduced value. Each device's piece is in :attr:`local_shards`.
        """
        spec = self._recorded()
        if grad_placements is not None:
            spec = ShardingSpec.from_placements(self._known_spec().mesh if spec is None else spec.mesh,
                                                list(grad_placements), self.dim())
        return R.Alias.apply(self, R.grad_spec_of(spec))

    def full_tensor(self, *, grad_placements: Sequence[Any] | None = None) -> LazyTensor:
        """The whole tensor (reduced if ``Partial``), replicated on every device of the mesh (lazy)."""
        m = self._source_spec().mesh
        from torch.distributed.tensor.placement_types import Replicate
        return self.redistribute(m, [Replicate()] * m.ndim).to_local(grad_placements=grad_placements)

    def redistribute(self, device_mesh: Any = None, placements: Sequence[Any] | None = None, *,
                     async_op: bool = False, forward_dtype: torch.dtype | None = None,
                     backward_dtype: torch.dtype | None = None) -> XLAShardedTensor:
        """A new tensor with the same value laid out by ``placements`` on ``device_mesh``.

        A sharding constraint in the next program, so XLA picks the collective (a
        ``Partial`` source reduced into ``Shard`` is a reduce-scatter).
        Differentiable: the gradient goes back in this tensor's layout (``Partial``
        replicated). ``async_op`` is accepted (XLA schedules the collectives);
        ``forward_dtype`` casts before the move, ``backward_dtype`` casts the gradient.

        Raises:
            MeshDevicesError: ``device_mesh`` has other devices than the current mesh.
            RankError: not one placement per mesh axis.
        """
        del async_op
        src = self._source_spec()
        m, mesh_arg = (src.mesh, None) if device_mesh is None else _mesh_of(device_mesh)
        if sorted(m.root.device_ids) != sorted(src.mesh.root.device_ids):
            raise MeshDevicesError(
                f"redistribute cannot move data to other devices: the tensor is on devices "
                f"{sorted(src.mesh.root.device_ids)} but the target mesh {m!r} has "
                f"{sorted(m.root.device_ids)}; distribute a copy (distribute_tensor) instead")
        from torch.distributed.tensor.placement_types import Replicate
        placements = list(placements) if placements is not None else [Replicate()] * m.ndim
        spec = ShardingSpec.from_placements(m, placements, self.dim())
        x: LazyTensor = self if forward_dtype is None else self.to(forward_dtype)
        out = R.Relayout.apply(x, spec, src.reduced())
        if backward_dtype is not None:
            out = _GradCast.apply(out, backward_dtype)
        return XLAShardedTensor.wrap(out)._record(spec, mesh_arg if mesh_arg is not None else
                                                  getattr(self, "_dt_mesh_arg", None))

    def _source_spec(self) -> ShardingSpec:
        """This tensor's layout for a relayout: recorded, annotated, else propagated."""
        spec = self._recorded()
        return spec if spec is not None else self._known_spec()

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


_EMPTY_LIKE, _COPY = torch.ops.aten.empty_like.default, torch.ops.aten.copy_.default


def _keep_layout(func: Any, args: tuple, kwargs: dict) -> Any:
    """``empty_like`` of an annotated tensor keeps its layout (``to_empty`` of a tied weight
    met twice); a CPU tensor copied into one is placed shard by shard. ``None``: the
    general path."""
    from xla_dtensor.spmd import meta_init
    t = args[0]
    if not isinstance(t, XLAShardedTensor) or A.sticky_spec(t) is None:
        return None
    if func is _COPY:
        return meta_init.copy_from_host(t, args[1]) if len(args) == 2 and not kwargs.get("non_blocking") else None
    if set(kwargs) - {"dtype", "device", "layout", "pin_memory", "memory_format"}:
        return None
    return meta_init.empty_like(t, kwargs.get("device"), kwargs.get("dtype"))


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


class _Reached(Exception):
    pass


class _Probe(DTensor):
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise _Reached


@functools.cache
def subclass_dispatch_works() -> bool:
    """Whether this torch calls a ``DTensor`` subclass's own ``__torch_dispatch__`` (found once, by trying
    it on a meta tensor: torch 2.10 and 2.11 send the subclass to DTensor's C++ dispatcher)."""
    probe = torch.Tensor._make_wrapper_subclass(_Probe, (1,), dtype=torch.float32, device="meta")
    try:
        probe.detach()
    except _Reached:
        return True
    except Exception:  # noqa: BLE001 - DTensor's dispatcher reading the probe's unset fields
        return False
    return False


def _wrap_plain(t: LazyTensor) -> XLAShardedTensor:
    """A new ``XLAShardedTensor`` object over ``t``'s storage (no autograd history)."""
    if not subclass_dispatch_works():
        raise TorchVersionError(
            f"sharded tensors need torch >= 2.12; torch {torch.__version__} sends every subclass of DTensor "
            "(XLAShardedTensor is one) through DTensor's own C++ dispatcher, which bypasses the subclass's "
            "__torch_dispatch__ (pytorch/pytorch#177716, fixed in 2.12). Lazy mode and xla_dtensor.compile on "
            "one device work on this torch; upgrade torch to shard.")
    out = wrap_like(XLAShardedTensor, t)
    if is_view(t):
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


class _GradCast(torch.autograd.Function):
    """Identity forward; the gradient cast to ``dtype`` (``redistribute(backward_dtype=)``)."""

    @staticmethod
    def forward(ctx: Any, x: LazyTensor, dtype: torch.dtype) -> LazyTensor:  # noqa: ANN401
        ctx.dtype = dtype
        return _wrap_plain(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad.to(ctx.dtype), None


def _mesh_of(device_mesh: Any) -> tuple[Mesh, Any]:
    """``(mesh.Mesh, the object given)``; ``None`` means torch's current mesh, then the global one."""
    if device_mesh is None:
        from torch.distributed.device_mesh import _mesh_resources
        stack = getattr(_mesh_resources, "mesh_stack", None)
        device_mesh = stack[-1] if stack else None
    return A.as_mesh(device_mesh), device_mesh


# The entry above in C (core.native): torch calls the lazy tensor's C entry with this class, which sets
# tensor.OUT.cls itself and takes _keep_layout's two ops and _rewrap from here (~2 us an op less: a GPT
# step under AUTO enters here ~800 times).
from xla_dtensor.core import native as _native  # noqa: E402

PYTHON_ENTRY = XLAShardedTensor.__dict__["__torch_dispatch__"].__func__  # the entry in Python (tests compare)
direct_subclass(XLAShardedTensor)
if _native.ON:
    _native.MODULE.configure_own_class(XLAShardedTensor, (_EMPTY_LIKE, _COPY), _keep_layout, _rewrap)
    XLAShardedTensor.__torch_dispatch__ = classmethod(_LAZY_DISPATCH)  # type: ignore[assignment]
    from xla_dtensor.core import cxx as _cxx
    _cxx.own_class(XLAShardedTensor)  # the hot ops' kernel takes this class's calls to the entry too
