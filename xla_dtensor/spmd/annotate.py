"""Sharding annotations on lazy tensors, torch_xla style: ``mark_sharding`` and friends.

Where a sharding lives:

* ``mark_sharding`` on a root tensor records the spec on its :class:`Storage` (a
  *sticky* annotation, like torch_xla's per-tensor sharding spec): device data is
  resharded at once; a pending value gets a constraint; and at every ``sync()`` a
  pending value of that storage (say a parameter after ``optimizer.step()``) is
  constrained again, so it comes back with the same layout.
* On a view (torch_xla issue 8662), the view's current value gets the constraint and
  the spec is remembered for that view; the base is untouched.
* Tensors nobody annotated carry what XLA propagated: after ``sync()`` their data is a
  ``jax.Array`` whose sharding :func:`get_spec` / :func:`get_hlo_sharding` report (torch_xla
  issue 7846). Before ``sync()`` such a value's layout is not decided yet (``None``).
"""
from __future__ import annotations

import weakref
from typing import Any, Sequence

import jax

from mesh import Mesh, from_torch, get_global_mesh, torch_bridge
from xla_dtensor.core import executor, state, threads
from xla_dtensor.core.ir import DATA, data_leaf
from xla_dtensor.core.tensor import LazyTensor, Storage, is_view, meta_of, set_view_value, storage_of, value_of
from xla_dtensor.sharding import HloSharding, ShardingSpec
from xla_dtensor.core import layout as L
from xla_dtensor.spmd.errors import MeshDevicesError, NotShardableError

# NOTE: a root tensor's sticky layout is its storage's ``layout`` (see :func:`stick`)
_VIEW_SPECS: dict[int, tuple[weakref.ref, ShardingSpec, int]] = {}
_REPADDED: list[tuple[Storage, tuple, Any]] = []
_FROM_TORCH: dict[Any, Mesh] = {}  # (torch DeviceMesh, its root) -> our Mesh; both hash by value


def submesh(device_mesh: Any, axes: str | Sequence[str]) -> Any:
    """``device_mesh[axes]``: kept as an alias now that ``device_mesh["tp"]`` works on an
    ``"xla"`` mesh (``import xla_dtensor`` teaches torch to slice one without process
    groups). The result remembers its root, so placements on it mean "replicated along
    the root's other axes", as in DTensor. A :class:`mesh.Mesh` is sliced the same way.

    Example:
        >>> from torch.distributed.device_mesh import DeviceMesh
        >>> dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("dp", "tp"))
        >>> submesh(dm, "tp").mesh.tolist()
        [0, 1, 2, 3]
    """
    names = (axes,) if isinstance(axes, str) else tuple(axes)
    if isinstance(device_mesh, Mesh):
        return device_mesh[names]
    return torch_bridge.slice_xla_mesh(device_mesh, names)


def as_mesh(device_mesh: Any) -> Mesh:
    """A :class:`mesh.Mesh` from a Mesh, a torch ``DeviceMesh("xla", ...)`` (sliced or
    flattened ones included) or ``None`` (global).

    Raises:
        MeshDevicesError: the mesh names device ids JAX does not have.
    """
    if device_mesh is None:
        device_mesh = get_global_mesh()
        if device_mesh is None:
            raise NotShardableError("no mesh given and no global mesh set (mesh.set_global_mesh)")
    if isinstance(device_mesh, Mesh):
        check_devices(device_mesh)
        return device_mesh
    root = getattr(device_mesh, "_root_mesh", None)
    key = (device_mesh, None if root is None else (root, root.mesh_dim_names))  # torch's == ignores the root
    try:
        m = _FROM_TORCH.get(key)
    except TypeError:  # not hashable: not a DeviceMesh; from_torch says so
        key, m = None, None
    if m is None:
        m = from_torch(device_mesh)
        check_devices(m)
        if key is not None:
            _FROM_TORCH[key] = m
    return m


def check_devices(m: Mesh) -> None:
    """Raise :class:`MeshDevicesError` unless every device id of ``m`` is a JAX device."""
    known = {d.id for d in jax.devices()}
    missing = [i for i in m.device_ids if i not in known]
    if missing:
        raise MeshDevicesError(f"mesh {m!r} names device ids {missing} that JAX does not have; "
                               f"available device ids: {sorted(known)}")


def _require_lazy(t: Any, what: str) -> LazyTensor:
    if not isinstance(t, LazyTensor):
        kind = f"a tensor on {t.device}" if hasattr(t, "device") else type(t).__name__
        raise NotShardableError(f"{what} needs a tensor on the jax device (xla_dtensor.device()), "
                                f"got {kind}; move it there first with .to(xla_dtensor.device())")
    return t


@threads.locked  # NOTE: rebinds a storage another thread's sync() may be reading
def apply_spec(t: LazyTensor, spec: ShardingSpec) -> None:
    """Lay ``t`` out as ``spec`` in place (see the module doc). ``spec`` must be valid for ``t``."""
    shape, dtype = meta_of(t)[0], meta_of(t)[1]
    if is_view(t):
        set_view_value(t, L.constrain(value_of(t), L.named(spec)))
        _VIEW_SPECS[id(t)] = (weakref.ref(t, _forget(id(t))), spec, storage_of(t).version)
        return
    s = storage_of(t)
    s.value = L.reshard(s.value, shape, dtype, spec)
    s.version += 1
    s.layout = spec


def _forget(key: int) -> Any:
    return lambda _ref: _VIEW_SPECS.pop(key, None)


def mark_sharding(t: Any, mesh: Any, partition_spec: Sequence[Any]) -> Any:
    """Annotate ``t`` in place with a torch_xla partition spec; returns it as a sharded tensor.

    On device data the data moves to the new layout now; on a pending value (an
    intermediate) the annotation becomes a sharding constraint in the program. A failing
    annotation (bad spec, wrong rank, unknown axis) raises before anything changes.

    Args:
        t: a tensor on the jax device.
        mesh: a :class:`mesh.Mesh`, a torch ``DeviceMesh("xla", ...)``, or ``None`` (global mesh).
        partition_spec: one entry per dim: ``None``, a mesh axis, or a tuple of mesh axes.

    Example:
        >>> import torch, xla_dtensor
        >>> from xla_dtensor.spmd import Mesh, mark_sharding
        >>> m = Mesh(range(8), (4, 2), ("x", "y"))
        >>> t = torch.zeros(8, 4, device=xla_dtensor.device())
        >>> mark_sharding(t, m, ("x", "y")).sharding_spec
        '{devices=[4,2]<=[8]}'
    """
    t = _require_lazy(t, "mark_sharding")
    m = as_mesh(mesh)
    spec = ShardingSpec.from_partition_spec(m, partition_spec, ndim=t.dim())
    apply_spec(t, spec)
    from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor
    return XLAShardedTensor.wrap(t)


def clear_sharding(t: Any) -> Any:
    """Drop ``t``'s annotation; its data becomes replicated over the devices it was on.

    Example:
        >>> import torch, xla_dtensor
        >>> from xla_dtensor.spmd import Mesh, clear_sharding, get_spec, mark_sharding
        >>> t = torch.zeros(8, device=xla_dtensor.device())
        >>> _ = mark_sharding(t, Mesh(range(8), (8,), ("x",)), ("x",))
        >>> get_spec(clear_sharding(t)).shard_counts
        (1,)
    """
    t = _require_lazy(t, "clear_sharding")
    spec = get_spec(t)
    entry = _VIEW_SPECS.pop(id(t), None)
    if is_view(t):
        if entry is not None and L.is_constraint(value_of(t)):
            set_view_value(t, value_of(t).inputs[0])
        return t
    storage_of(t).layout = None
    if spec is not None and not spec.is_replicated:
        apply_spec(t, ShardingSpec.replicated(spec.mesh, t.dim()))
        storage_of(t).layout = None
    return t


def sticky_spec(t: LazyTensor) -> ShardingSpec | None:
    """The spec the user gave ``t`` (``mark_sharding``/``distribute_tensor``), else ``None``."""
    if is_view(t):
        entry = _VIEW_SPECS.get(id(t))
        return entry[1] if entry is not None and entry[0]() is t else None
    return storage_of(t).layout


def get_spec(t: LazyTensor) -> ShardingSpec | None:
    """``t``'s layout: its annotation, else the layout XLA gave its data, else ``None`` (pending).

    A propagated layout that no mesh axis ordering explains (rare) is returned on the
    tile-assignment mesh (unnamed axes).
    """
    spec = sticky_spec(t)
    if spec is not None:
        return spec
    v = value_of(t)
    if L.is_constraint(v) and isinstance(v.sharding, jax.sharding.NamedSharding):
        return ShardingSpec.from_jax(v.sharding, t.dim())
    if v.op == DATA and isinstance(v.data, jax.Array):
        return _spec_of_array(v.data, t.dim())
    return None


def get_hlo_sharding(t: LazyTensor) -> str | None:
    """``t``'s layout as an HLO sharding string (device ids), or ``None`` while undecided."""
    spec = get_spec(t)
    if spec is not None:
        return str(spec.reduced().on_root().to_hlo())
    return None


def _spec_of_array(arr: jax.Array, ndim: int) -> ShardingSpec | None:
    s = arr.sharding
    if isinstance(s, jax.sharding.NamedSharding) and not _has_unconstrained(s):
        return ShardingSpec.from_jax(s, ndim)
    hlo = HloSharding.parse(str(s._to_xla_hlo_sharding(ndim)))
    ids = [d.id for d in s._device_assignment]
    if hlo.is_maximal:
        return None
    if not hlo.is_tiled:
        return ShardingSpec.replicated(Mesh(ids, (len(ids),)), ndim)
    hlo = HloSharding(hlo.tile_shape, tuple(ids[p] for p in hlo.devices), hlo.replicas)
    return ShardingSpec.from_hlo(hlo, None, ndim)


def _has_unconstrained(s: jax.sharding.NamedSharding) -> bool:
    return any(e is jax.sharding.PartitionSpec.UNCONSTRAINED for e in s.spec)


# -- sync hooks: sticky layouts survive in-place updates ------------------------------
def stick(storage: Storage, spec: ShardingSpec | None) -> None:
    """Make ``spec`` the layout every sync keeps ``storage`` in (None: none, a plan decides)."""
    storage.layout = spec


# the even layouts seen before as layout.constrain_stored reads them: (id(spec), shape) -> (spec, its
# NamedSharding, constraint key, hash)
_EVEN: dict[tuple, tuple] = {}


def _pre_sync(pending: list[Storage]) -> None:
    if state.STATE.deferring:  # sync(): even layouts as the program's output shardings, no nodes
        shardings, uneven = L.stored_shardings(pending)
        if shardings.count(None) < len(shardings):
            state.hold(shardings)
        for s in uneven:
            _repad(s)
        return
    # NOTE: compile's traces: the layouts seen before, at once (an AUTO-planned GPT step: ~600 sticky pending
    # storages each sync); here only new and uneven ones
    for s in L.constrain_stored(pending, _EVEN):
        spec, ns, even, _ = L.laid(s.layout, s.meta[0])
        if not even:
            _repad(s)
            continue
        if len(_EVEN) >= 4096:
            _EVEN.clear()
        _EVEN[(id(spec), s.meta[0])] = (spec, ns, *L.constraint_key(ns))
        if not L.is_constraint(s.value, ns):
            s.value = L.constrain(s.value, ns)


def _repad(s: Storage) -> None:
    """Compute ``s`` (of an uneven sticky layout) padded, to be unpadded after the sync."""
    shape = s.meta[0]
    _, ns, _, pshape = L.laid(s.layout, shape)
    s.value = L.pad(s.value, shape, pshape, ns)
    _REPADDED.append((s, pshape, ns))


def _post_sync(pending: list[Storage]) -> None:
    while _REPADDED:
        s, pshape, ns = _REPADDED.pop()
        s.value = L.unpad(data_leaf(s.value.data, pshape, s.meta[1]), s.meta[0], ns)


def _keep_pending(s: Storage) -> bool:
    """``.cpu()`` of an annotated tensor must not rebind it to an unannotated result; the
    next ``sync()`` computes it with its layout (an uneven one stays padded)."""
    return s.layout is not None


def _state_layouts(optimizer: Any, args: Any, kwargs: Any) -> None:
    """After an optimizer step: each state tensor of a sticky parameter's shape that has no layout of its own
    takes the parameter's (as a DTensor parameter's state takes its placements).

    NOTE: so the state made in the first step leaves that step's program in a layout known before it runs
    (``core.packs`` packs it from then on); XLA would otherwise propagate one. Looked at when the number of
    parameters with state changes, not every step.
    """
    state_of = optimizer.state
    n = len(state_of)
    if _STATE_SEEN.get(optimizer) == n:
        return
    _STATE_SEEN[optimizer] = n
    for p, slots in state_of.items():
        spec = sticky_spec(p) if isinstance(p, LazyTensor) and not is_view(p) else None
        if spec is None:
            continue
        for t in slots.values():
            if isinstance(t, LazyTensor) and not is_view(t) and t.shape == p.shape and sticky_spec(t) is None:
                stick(storage_of(t), spec)


_STATE_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> parameters with state seen


def install_hooks() -> None:
    """Register the sync hooks and the optimizer-state hook once (importing :mod:`xla_dtensor.spmd` does it)."""
    if _pre_sync not in executor.PRE_SYNC:
        executor.PRE_SYNC.append(_pre_sync)
        executor.POST_SYNC.append(_post_sync)
        executor.KEEP_PENDING.append(_keep_pending)
        from torch.optim.optimizer import register_optimizer_step_post_hook
        register_optimizer_step_post_hook(_state_layouts)
