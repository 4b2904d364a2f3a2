"""Sharded parameters of a meta module: the layout first, the memory at ``to_empty``.

The recipe for a model bigger than one device (torchtitan's, HF's ``init_empty_weights``)::

    with torch.device("meta"):
        model = Model()                                   # no memory
    parallelize_module(model, mesh["tp"], plan)           # or distribute_module / shard_model / AUTO
    model.to_empty(device=xla_dtensor.device())           # each shard on its own devices
    model.init_weights()  # or reset_parameters(), torch.nn.init.*, load_state_dict, dcp.load

Invariants:

* ``distribute_tensor`` of a meta tensor (every style, ``distribute_module``, FSDP-style
  and AUTO reach it) returns a :class:`MetaShardedTensor`: an ``XLAShardedTensor`` (so a
  ``DTensor``) on the ``meta`` device whose storage holds no data, only the layout (the
  sticky spec on its storage, the placements it was made with).
* ``torch.empty_like(t, device=xla_dtensor.device())`` (what ``to_empty`` calls) gives a
  sharded tensor with that layout whose value is a pending ``zeros``: nothing is
  allocated anywhere until the next ``sync()``, which computes it (after whatever
  initialization was recorded on it) in its layout, each device holding only its
  shard. A CPU tensor copied in (``load_state_dict``) is placed shard by shard.
* An AUTO module's meta parameters carry no layout; after ``to_empty`` they are pending
  too, so the first training step's ``sync()`` plans from the recorded (data-free) graph
  and computes them, with their initialization, directly in the planned layout.
* On a meta sharded tensor, in-place ops are no-ops (torch's meta semantics), ``detach``
  and ``empty_like`` keep the layout; every other op raises :class:`MetaParameterError`
  (a forward before ``to_empty``), as does ``to_empty`` to a device that is not ours.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from xla_dtensor.core.device import DEVICE_NAME
from xla_dtensor.core.ir import Node
from xla_dtensor.core.tensor import Storage, adopt, is_view, meta_of, storage_of, value_of, wrap_like, write
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A
from xla_dtensor.core import layout as L
from xla_dtensor.spmd.errors import MetaParameterError
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor, _wrap_plain

aten = torch.ops.aten
_new = torch.Tensor._make_wrapper_subclass
_DETACH = (aten.detach.default, aten.alias.default, aten.lift_fresh.default)
_EMPTY = (aten.empty_like.default, aten.zeros_like.default)
META = "meta_sharded"  # the IR op of a meta storage's placeholder value (never lowered)


class MetaShardedTensor(XLAShardedTensor):
    """A sharded tensor on the ``meta`` device: shape, dtype and layout, no data (module doc)."""

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        return _dispatch(func, args, kwargs or {})

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        spec = self._recorded()
        where = "undecided (AUTO)" if A.sticky_spec(self) is None else str(spec.to_placements())
        return (f"XLAShardedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, device='meta', "
                f"placements={where})")


def meta_sharded(shape: tuple[int, ...], dtype: torch.dtype, stride: tuple[int, ...], spec: ShardingSpec,
                 mesh_arg: Any, *, sticky: bool = True) -> MetaShardedTensor:
    """A new :class:`MetaShardedTensor` laid out as ``spec`` (``sticky=False``: AUTO decides later)."""
    meta = (tuple(shape), dtype, tuple(stride))
    t = _new(MetaShardedTensor, meta[0], strides=meta[2], dtype=dtype, device="meta")
    key = (META, meta[0], dtype)
    storage = Storage(Node(META, key, (), hash(key), None), meta)  # NOTE: not in LIVE: never pending
    adopt(t, storage, meta)
    if sticky:
        A.stick(storage, spec.reduced())
    return t._record(spec, mesh_arg)


def _alias(t: MetaShardedTensor) -> MetaShardedTensor:
    out = wrap_like(MetaShardedTensor, t, device="meta")
    out._dt_spec, out._dt_version, out._dt_mesh_arg = t._dt_spec, t._dt_version, t._dt_mesh_arg
    return out


def _dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    t = _first_meta(args, kwargs)
    if func in _DETACH:
        return _alias(t)
    if func in _EMPTY:
        return empty_like(t, kwargs.get("device"), kwargs.get("dtype"))
    if func is aten._to_copy.default:
        return _to_copy(t, kwargs)
    if func._schema.is_mutable and args and isinstance(args[0], MetaShardedTensor):
        return args[0]  # NOTE: torch's meta semantics: in-place ops (init functions) change nothing
    raise MetaParameterError(
        f"{func}: an input is a sharded tensor still on the meta device (shape {tuple(t.shape)}, "
        f"placements {_placements(t)}): it has no data yet. Allocate it with "
        f"module.to_empty(device=xla_dtensor.device()), then initialize it (reset_parameters(), "
        f"init_weights(), torch.nn.init.*) or load a state dict, before running the module")


def _first_meta(args: tuple, kwargs: dict) -> MetaShardedTensor:
    for a in (*args, *kwargs.values()):
        for x in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(x, MetaShardedTensor):
                return x
    raise AssertionError("MetaShardedTensor dispatch without a MetaShardedTensor argument")


def _placements(t: MetaShardedTensor) -> Any:
    return "undecided (AUTO)" if A.sticky_spec(t) is None else tuple(t.placements)


def _to_copy(t: MetaShardedTensor, kwargs: dict) -> Any:
    device = kwargs.get("device")
    if device is None or torch.device(device).type == "meta":
        dtype = kwargs.get("dtype") or t.dtype
        spec = t._recorded()
        out = meta_sharded(meta_of(t)[0], dtype, meta_of(t)[2], spec, t._dt_mesh_arg, sticky=A.sticky_spec(t) is not None)
        return out
    raise MetaParameterError(
        f"cannot copy a sharded meta tensor (shape {tuple(t.shape)}, placements {_placements(t)}) to "
        f"{device}: it has no data. Use module.to_empty(device=xla_dtensor.device()) to allocate its "
        f"shards, then initialize or load it")


def empty_like(t: XLAShardedTensor, device: Any, dtype: torch.dtype | None) -> XLAShardedTensor:
    """``torch.empty_like(t, device=device)`` keeping ``t``'s layout (``to_empty``'s allocation).

    On our device: a pending zeros in ``t``'s layout (nothing allocated before the next
    ``sync()``, which computes each shard on its own device). On ``meta``: another meta
    sharded tensor.

    Raises:
        MetaParameterError: ``device`` is neither ours nor ``meta``.
    """
    dtype = dtype or t.dtype
    kind = "meta" if device is None and t.is_meta else torch.device(device or DEVICE_NAME).type
    spec = t._recorded() or A.sticky_spec(t)
    sticky = A.sticky_spec(t) is not None
    if kind == "meta":
        return meta_sharded(meta_of(t)[0], dtype, meta_of(t)[2], spec, getattr(t, "_dt_mesh_arg", None), sticky=sticky)
    if kind != DEVICE_NAME:
        mesh = spec.mesh.root.device_ids if spec is not None else "the mesh"
        raise MetaParameterError(
            f"cannot allocate a sharded tensor (shape {tuple(t.shape)}, placements {_placements_of(t)}) on "
            f"{device}: its shards live on the jax devices {mesh}. Use module.to_empty(device="
            f"xla_dtensor.device()) (device type {DEVICE_NAME!r})")
    out = _zeros(tuple(meta_of(t)[0]), dtype)
    if sticky:
        A.stick(storage_of(out), A.sticky_spec(t))
    res = _wrap_plain(out)
    return res._record(spec, getattr(t, "_dt_mesh_arg", None)) if spec is not None else res


def _placements_of(t: XLAShardedTensor) -> Any:
    return _placements(t) if isinstance(t, MetaShardedTensor) else tuple(t.placements)


def _zeros(shape: tuple[int, ...], dtype: torch.dtype) -> Any:
    """A pending zeros of ``shape`` (a recorded ``aten.zeros``: computed inside the next program)."""
    return torch.zeros(shape, dtype=dtype, device=DEVICE_NAME)


def copy_from_host(dst: XLAShardedTensor, src: torch.Tensor) -> XLAShardedTensor | None:
    """``dst.copy_(src)`` for a CPU ``src`` of ``dst``'s shape into an annotated root tensor:
    placed shard by shard (each device receives only its slice), or ``None`` where the
    general copy applies."""
    spec = A.sticky_spec(dst)
    if spec is None or is_view(dst) or type(src) not in (torch.Tensor, torch.nn.Parameter) \
            or src.device.type != "cpu" or tuple(src.shape) != tuple(dst.shape):
        return None
    host = src.detach()
    if host.dtype != dst.dtype:
        host = host.to(dst.dtype)
    write(dst, L.place_host(host, spec))
    return dst


def is_meta_placeholder(t: Any) -> bool:
    """Whether ``t`` is a sharded tensor whose value is a meta placeholder (no data)."""
    return isinstance(t, XLAShardedTensor) and value_of(t).op == META
