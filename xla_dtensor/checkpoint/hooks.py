"""torch.distributed.checkpoint's tensor protocol for lazy tensors (what DTensor implements).

DCP asks a tensor three things (``xla_dtensor._dcp_protocol`` puts the three methods on
``LazyTensor``, forwarding here):

* ``__create_write_items__``: one write item per distinct shard this process holds
  (replica 0 only, padding cut off), so a replicated value is written once;
* ``__create_chunk_list__`` (load planning): the distinct shards this process needs. It
  opens a *load session*: one CPU staging buffer per shard;
* ``__get_tensor_shard__``: on save, a CPU copy of one shard; on load, that shard's
  staging buffer. DCP narrows it and ``copy_``-s the checkpoint data into it; the buffer
  counts the elements that arrive. The sessions one load opens form a group (:class:`_Load`:
  those opened by one planner's ``create_local_plan`` for one checkpoint's metadata); when
  every session of the group is full, each tensor's device array is built in its own
  layout (each device gets only its shard) and becomes its value, all in one go. So a
  load that fails half way (a damaged item, even with torch's own ``FileSystemReader``)
  leaves every device target of this process as it was; the staging buffers go at the
  next load. A session that never fills leaves its tensor as it was; our
  :class:`~xla_dtensor.checkpoint.planners.LoadPlanner` refuses such a load up front.

Example:
    >>> import torch, xla_dtensor
    >>> from torch.distributed.tensor import Shard
    >>> from mesh import Mesh
    >>> t = xla_dtensor.distribute_tensor(torch.arange(8.), Mesh(range(4), (4,), ("x",)), [Shard(0)])
    >>> [(w.index.offset, w.tensor_data.chunk.sizes) for w in write_items("w", t)][:2]
    [(torch.Size([0]), torch.Size([2])), (torch.Size([2]), torch.Size([2]))]
"""
from __future__ import annotations

import sys
import weakref
from typing import Any

import jax
import numpy as np
import torch
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import LoadPlanner, TensorWriteData, WriteItem, WriteItemType

from xla_dtensor.core.executor import materialize
from xla_dtensor.core.ir import data_leaf
from xla_dtensor.core.tensor import LazyTensor, is_view, rebind, value_of, write
from xla_dtensor.core import layout as L

Box = tuple[tuple[int, ...], tuple[int, ...]]  # (offsets, sizes) in the global tensor

# NOTE: a session lives on its tensor (attribute ``_dcp_session``); this set only lists them
_OPEN: weakref.WeakSet[_Session] = weakref.WeakSet()
_PLANNING: list[_Load | None] = [None]  # the load whose planning opened the latest sessions


def _array(t: LazyTensor) -> tuple[jax.Array, tuple[int, ...] | None]:
    """The device array behind ``t`` and, for an uneven (padded) layout, its padded shape."""
    src = L.padded_source(value_of(t)) if not is_view(t) else None
    if src is not None:
        return src.data, tuple(src.data.shape)
    arr = materialize(t)
    return (arr if isinstance(arr, jax.Array) else jax.device_put(arr)), None


def _box(index: tuple[slice, ...], shape: tuple[int, ...]) -> Box | None:
    """A shard's ``index`` clipped to the logical ``shape``; None when it is only padding."""
    lo = tuple(s.start or 0 for s in index)
    hi = tuple(min(s.stop if s.stop is not None else n, n) for s, n in zip(index, shape))
    if any(a >= b for a, b in zip(lo, hi)) and shape:
        return None
    return lo, tuple(b - a for a, b in zip(lo, hi))


def local_boxes(t: LazyTensor, *, replica0_only: bool) -> dict[Box, list[Any]]:
    """The distinct shards of ``t`` this process addresses, each with its device shards."""
    arr, _ = _array(t)
    shape = tuple(t.shape)
    if t.numel() == 0 and shape:  # one empty piece, written by process 0
        return {((0,) * len(shape), shape): []} if jax.process_index() == 0 or not replica0_only else {}
    boxes: dict[Box, list[Any]] = {}
    for sh in arr.addressable_shards:
        if replica0_only and sh.replica_id != 0:
            continue
        box = _box(sh.index, shape) if shape else ((), ())
        if box is not None:
            boxes.setdefault(box, []).append(sh)
    return boxes


def _chunk(box: Box) -> ChunkStorageMetadata:
    return ChunkStorageMetadata(offsets=torch.Size(box[0]), sizes=torch.Size(box[1]))


def write_items(fqn: str, t: LazyTensor) -> list[WriteItem]:
    """DCP write items: one per distinct shard whose replica 0 this process holds."""
    _end_session(t)  # a save after a load that never filled reads the tensor, not stale buffers
    if jax.process_count() > 1 and jax.process_index() != 0 and _array(t)[0].is_fully_addressable:
        return []  # NOTE: a process-local array (not a global one): every process has its own; 0 writes it
    props = TensorProperties(dtype=t.dtype, requires_grad=False)
    size = torch.Size(t.shape)
    return [WriteItem(index=MetadataIndex(fqn, torch.Size(box[0])), type=WriteItemType.SHARD,
                      tensor_data=TensorWriteData(chunk=_chunk(box), properties=props, size=size))
            for box in sorted(local_boxes(t, replica0_only=True))]


def chunk_list(t: LazyTensor) -> list[ChunkStorageMetadata]:
    """DCP load planning: the shards this process fills; opens a load session on ``t``."""
    _end_session(t)  # NOTE: planned again (a new load): the old session must not hold its group back
    session = _Session(t, _load_being_planned())
    t.__dict__["_dcp_session"] = session
    _OPEN.add(session)
    return [_chunk(box) for box in session.boxes]


class _Load:
    """The sessions one DCP load opened on this process: committed together once all are full.

    ``planner``/``metadata``: weak references naming the load (None: a load of one tensor,
    when no planner is found on the stack).
    """

    def __init__(self, planner: LoadPlanner | None = None) -> None:
        self.planner = weakref.ref(planner) if planner is not None else None
        meta = getattr(planner, "metadata", None)
        self.metadata = weakref.ref(meta) if meta is not None else None
        self.sessions: list[_Session] = []

    def plans(self, planner: LoadPlanner) -> bool:
        meta = getattr(planner, "metadata", None)
        return (self.planner is not None and self.planner() is planner
                and (self.metadata() if self.metadata is not None else None) is meta)

    def session_full(self) -> None:
        waiting = [s for s in self.sessions if not s.done]
        if all(s.full() for s in waiting):
            for s in waiting:
                s._flush()

    def abandon(self) -> None:
        """A later load began: this one failed or stopped half way; its targets stay as they were."""
        for s in self.sessions:
            t = s.target()
            if t is not None and t.__dict__.get("_dcp_session") is s:
                _end_session(t)


def _load_being_planned() -> _Load:
    """The load whose ``LoadPlanner.create_local_plan`` is on the stack (a new one when it changed)."""
    f, planner = sys._getframe(2), None
    for _ in range(40):
        if f is None:
            break
        if f.f_code.co_name == "create_local_plan" and isinstance(f.f_locals.get("self"), LoadPlanner):
            planner = f.f_locals["self"]
            break
        f = f.f_back
    if planner is None:
        return _Load()
    current = _PLANNING[0]
    if current is not None and current.plans(planner):
        return current
    if current is not None:
        current.abandon()
    _PLANNING[0] = _Load(planner)
    return _PLANNING[0]


def tensor_shard(t: LazyTensor, index: MetadataIndex) -> torch.Tensor:
    """The staging buffer of an open load session, else a CPU copy of the shard at ``index``."""
    offset = tuple(index.offset) if index.offset is not None else (0,) * t.dim()
    session = t.__dict__.get("_dcp_session")
    if session is not None and not session.done:
        return session.buffer(offset)
    if t.numel() == 0:
        return torch.empty(tuple(t.shape), dtype=t.dtype)
    for box, shards in local_boxes(t, replica0_only=False).items():
        if box[0] == offset:
            data = np.asarray(shards[0].data)[tuple(slice(0, n) for n in box[1])]
            return _to_torch(data, t.dtype)
    raise ValueError(f"{index.fqn!r}: this process holds no shard at offset {offset} "
                     f"(it holds {sorted(b[0] for b in local_boxes(t, replica0_only=False))})")


_INT_OF_WIDTH = {1: (np.int8, torch.int8), 2: (np.int16, torch.int16), 4: (np.int32, torch.int32),
                 8: (np.int64, torch.int64)}


def _to_torch(data: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of ``dtype`` with the bytes of ``data`` (a copy; bit-exact for every dtype)."""
    data = np.array(data, copy=True, order="C")  # NOTE: keeps 0-d (ascontiguousarray makes it 1-d)
    raw = data if data.dtype.kind in "bc" else data.view(_INT_OF_WIDTH[data.dtype.itemsize][0])
    return torch.from_numpy(raw).view(dtype)


def _to_numpy(cpu: torch.Tensor, like: np.dtype) -> np.ndarray:
    """The bytes of CPU tensor ``cpu`` as a numpy array of dtype ``like`` (no copy)."""
    if cpu.dtype.is_complex or cpu.dtype == torch.bool:
        return cpu.numpy().view(like)
    return cpu.view(_INT_OF_WIDTH[cpu.element_size()][1]).numpy().view(like)


def is_staging(t: torch.Tensor) -> bool:
    """``t`` is (a view of) a load session's staging buffer: the session commits it, not the planner."""
    return isinstance(t, _Stage)


def pending_sessions() -> list[_Session]:
    """Load sessions opened by DCP's planning and not (yet) filled."""
    return [s for s in list(_OPEN) if not s.done]


def close_sessions() -> None:
    """End every open load session: a load that failed half way leaves no staging behind."""
    for s in list(_OPEN):
        t = s.target()
        if t is not None:
            _end_session(t)


def _end_session(t: LazyTensor) -> None:
    session = t.__dict__.pop("_dcp_session", None)
    if session is not None:
        session.done = True
        _OPEN.discard(session)


class _Session:
    """A load in progress into one tensor: staging buffers per shard, filled by DCP."""

    def __init__(self, t: LazyTensor, load: _Load) -> None:
        self.target = weakref.ref(t)
        self.load = load
        load.sessions.append(self)
        if value_of(t).fn is not None:
            # NOTE: a pending value's layout is only final after a sync (an annotated one computed
            # alone comes back unconstrained); another tensor's DTensor query (DCP's planner asks
            # each target's device_mesh) may sync before this one flushes, so sync now
            from xla_dtensor.core.executor import sync
            sync()
        self.boxes = sorted(local_boxes(t, replica0_only=False))
        self.buffers: dict[tuple[int, ...], _Stage] = {}
        self.missing = sum(int(np.prod(b[1])) for b in self.boxes)
        self.done = False
        if self.missing == 0:
            self.done = True

    def buffer(self, offset: tuple[int, ...]) -> _Stage:
        buf = self.buffers.get(offset)
        if buf is None:
            t = self.target()
            box = next((b for b in self.boxes if b[0] == offset), None)
            if t is None or box is None:
                raise ValueError(f"no shard at offset {offset}: this process fills {[b[0] for b in self.boxes]}")
            buf = torch.empty(box[1], dtype=t.dtype).as_subclass(_Stage)
            buf._session = self
            self.buffers[offset] = buf
        return buf

    def arrived(self, n: int) -> None:
        self.missing -= n
        if self.full():
            self.load.session_full()

    def full(self) -> bool:
        return self.missing <= 0 and len(self.buffers) == len(self.boxes)  # NOTE: < 0: a tied tensor, filled twice

    def filled(self) -> tuple[int, int]:
        """(elements filled, elements this process must fill)."""
        total = sum(int(np.prod(b[1])) for b in self.boxes)
        return total - self.missing, total

    def _flush(self) -> None:
        t = self.target()
        self.done = True
        if t is None:
            return
        _end_session(t)
        arr, pshape = _array(t)
        shape = tuple(t.shape)
        gshape = pshape or shape
        like = np.dtype(arr.dtype)
        host = {off: _to_numpy(buf.as_subclass(torch.Tensor), like) for off, buf in self.buffers.items()}

        def fill(index: tuple[slice, ...]) -> np.ndarray:
            out = np.zeros([(s.stop if s.stop is not None else n) - (s.start or 0)
                            for s, n in zip(index, gshape)], like)
            box = _box(index, shape) if shape else ((), ())
            if box is not None:
                out[tuple(slice(0, n) for n in box[1])] = host[box[0]]
            return out

        if arr.committed:
            new = jax.make_array_from_callback(gshape, arr.sharding, fill)
        else:  # NOTE: data with no layout of its own stays uncommitted, as the core puts host data
            new = jax.device_put(fill(tuple(slice(0, n) for n in gshape)))
        leaf = data_leaf(new, gshape, t.dtype)
        if pshape is not None:
            rebind(t, L.unpad(leaf, shape, value_of(t).sharding))
        elif is_view(t):
            write(t, leaf)
        else:
            rebind(t, leaf)


class _Stage(torch.Tensor):
    """A CPU staging buffer (and its narrowed views) that reports each ``copy_`` into it."""

    _session: _Session

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        kwargs = kwargs or {}
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        owner = args[0] if args and isinstance(args[0], _Stage) else None
        if owner is None:
            return out
        if func is torch.Tensor.copy_:
            owner._session.arrived(owner.numel())
            return owner
        if func in _VIEWS and isinstance(out, torch.Tensor):
            out = out.as_subclass(_Stage)
            out._session = owner._session
        return out


_VIEWS = {torch.Tensor.narrow, torch.Tensor.detach, torch.Tensor.__getitem__, torch.narrow, torch.detach}
