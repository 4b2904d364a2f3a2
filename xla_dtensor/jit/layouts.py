"""Layouts of a compiled call's state, fixed at trace time so that the next call fits the trace.

Under sharding a tensor's layout after a step is whatever the program produced. Left to
XLA, an unannotated parameter comes back in a propagated layout (split like the batch,
say) that differs from the one it was read in, and every call would trace anew. So at
trace time, once the call is recorded:

* the sync hooks run on the pending values (sticky annotations, the AUTO plan, uneven
  padding), as at ``sync()`` (a call that is run by ``sync()`` instead of its own
  program skips them there);
* the program's *mesh* is the mesh of its first multi-device ``NamedSharding`` (an
  input's array or a constraint); none: one device, and nothing below applies;
* an input held on one device (an unannotated tensor moved with ``.to(device())``) of a
  program on several devices is *settled*: replicated over the mesh (torch_xla's rule for
  unannotated tensors);
* every storage the call writes is constrained to the layout it was read in (its
  annotation, where the user or the AUTO plan gave one, wins), every gradient the call
  creates or replaces to its parameter's layout, and every optimizer-state tensor the
  call creates (of its parameter's shape) to its parameter's layout.

A call that settled an input runs but is not cached: the next call traces again, with
the settled layouts, and replays from then on.

Example:
    >>> describe(None)
    'no layout (pending)'
"""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import jax
import torch
from jax.sharding import NamedSharding, PartitionSpec

from xla_dtensor.core import executor
from xla_dtensor.core.ir import DATA, Node, data_leaf
from xla_dtensor.core.tensor import LazyTensor, Storage, is_view, storage_of, value_of
from xla_dtensor.core import layout as L


def run_hooks(storages: Iterable[Storage]) -> None:
    """The sync hooks (``executor.PRE_SYNC``) on those of ``storages`` with a pending value, in creation order."""
    pending = sorted({id(s): s for s in storages if s.value.fn is not None}.values(), key=_seq)
    if not pending:
        return
    for hook in executor.PRE_SYNC:
        hook(pending)


def _seq(s: Storage) -> int:
    return s.seq


def program_mesh(leaves: list[Node], shardings: list[Any]) -> jax.sharding.Mesh | None:
    """The mesh of the first multi-device ``NamedSharding`` among the leaves' arrays and the constraints."""
    for n in leaves:
        s = getattr(n.data, "sharding", None)
        if isinstance(s, NamedSharding) and len(s.device_set) > 1:
            return s.mesh
    for s in shardings:
        if isinstance(s, NamedSharding) and len(s.device_set) > 1:
            return s.mesh
    return None


def single_device(value: Node) -> bool:
    """Whether ``value`` is device data held on one device (an unannotated ``.to(device())``)."""
    if value.op != DATA or not isinstance(value.data, jax.Array):
        return False
    return len(value.data.sharding.device_set) == 1


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def layout_at_start(value: Node, mesh: jax.sharding.Mesh) -> Any:
    """The layout ``value`` (a storage's value when the call began) is read in, settled over ``mesh``.

    A constraint node (an uneven or annotated pending value): its sharding. Device data:
    its array's sharding, or replicated over ``mesh`` when it is on one device. Else ``None``.
    """
    if L.is_constraint(value):
        return value.sharding
    if value.op != DATA or not isinstance(value.data, jax.Array):
        return None
    return replicated(mesh) if single_device(value) else value.data.sharding


def pin(storage: Storage, sharding: Any) -> None:
    """Constrain ``storage``'s pending value to ``sharding`` unless it is constrained already or
    ``sharding`` does not split its shape evenly (an uneven layout is the sticky hook's to keep)."""
    v = storage.value
    if sharding is None or L.is_constraint(v) or not _even(sharding, storage.meta[0]):
        return
    storage.value = L.constrain(v, sharding)
    storage.version += 1


def _even(sharding: Any, shape: tuple[int, ...]) -> bool:
    try:
        sharding.shard_shape(tuple(shape))
    except ValueError:
        return False
    return True


def final_layout(storage: Storage, start: Node | None, mesh: jax.sharding.Mesh) -> Any:
    """The layout ``storage`` has after the call: its constraint's, else the one it was read in."""
    v = storage.value
    if L.is_constraint(v):
        return v.sharding
    return layout_at_start(start, mesh) if start is not None else None


def pin_state(written: list[tuple[Storage, Node]], grads: list[tuple[LazyTensor, LazyTensor]],
              slots: list[tuple[LazyTensor, LazyTensor]], mesh: jax.sharding.Mesh) -> None:
    """Pin the written storages to their layouts at the start (``written``: (storage, value at
    the start)), then each new gradient and new optimizer slot (``(parameter, tensor)``) to
    its parameter's layout. Views and tensors of another shape than their parameter are left
    to XLA."""
    start = {id(s): old for s, old in written}
    for s, old in written:
        pin(s, layout_at_start(old, mesh))
    for p, t in grads + slots:
        if is_view(t) or tuple(t.shape) != tuple(p.shape) or is_view(p):
            continue
        ps = storage_of(p)
        pin(storage_of(t), final_layout(ps, start.get(id(ps), ps.value), mesh))


def settle_state(plan: Any, written: list[Storage], written_old: list[Node], params: list[LazyTensor],
                 optimizers: list[torch.optim.Optimizer], start: int) -> jax.sharding.Mesh | None:
    """Pin the call's state (see the module docstring) if its program (``plan``, before pinning)
    spans several devices; returns the program's mesh, else ``None`` (nothing changed).

    ``written``/``written_old``: the storages the call wrote and their values at its start;
    ``params``: the parameters whose gradient the call created or replaced; ``start``: the
    storage sequence number at the call's start (later ones were created by it).
    """
    mesh = program_mesh(plan.leaves, plan.shardings)
    if mesh is None or mesh.size < 2:
        return None
    grads = [(p, p.grad) for p in params]
    pin_state(list(zip(written, written_old)), grads, new_slots(optimizers, start), mesh)
    return mesh


def new_slots(optimizers: Iterable[torch.optim.Optimizer], start: int) -> list[tuple[LazyTensor, LazyTensor]]:
    """(parameter, state tensor) for every optimizer-state tensor created after sequence number ``start``."""
    out = []
    for opt in optimizers:
        for p, st in opt.state.items():
            if not isinstance(p, LazyTensor):
                continue
            for t in st.values():
                if isinstance(t, LazyTensor) and storage_of(t).seq > start and storage_of(t).value.fn is not None:
                    out.append((p, t))
    return out


def settle_hyperparameters(optimizers: Iterable[torch.optim.Optimizer]) -> None:
    """Replicate each small tensor hyperparameter on one device (a device-tensor lr, which a
    scheduler's ``fill_`` rewrites on one device) over the mesh of its group's parameters, so
    that a trace reads it replicated; a replay replicates the scheduler's new value
    (:meth:`xla_dtensor.jit.replay.Entry.replicate`)."""
    for opt in optimizers:
        for group in opt.param_groups:
            mesh = program_mesh([value_of(p) for p in group["params"][:1] if isinstance(p, LazyTensor)], [])
            if mesh is None:
                continue
            for v in group.values():
                for t in (v if type(v) is tuple else (v,)):
                    if isinstance(t, LazyTensor) and t.numel() <= 4096 and not is_view(t) \
                            and single_device(storage_of(t).value):
                        settle([(storage_of(t).value, [weakref.ref(storage_of(t))], replicated(mesh))])


def settle(inputs: list[tuple[Node, list, Any]]) -> None:
    """Move each ``(leaf, weakrefs of its holders, layout)`` to its layout; the holders that still
    hold the leaf hold the moved array from now on."""
    for n, refs, sharding in inputs:
        held = [s for s in (ref() for ref in refs) if s is not None and s.value is n]
        if not held:  # written by the call (its new value is pinned) or freed
            continue
        leaf = data_leaf(jax.device_put(n.data, sharding), n.key[1], n.key[2])
        for s in held:
            s.value = leaf
            s.version += 1


def describe(sharding: Any) -> str:
    """A layout in words: ``PartitionSpec`` and mesh axes, one device, or ``None`` (pending).

    Example:
        >>> describe(None)
        'no layout (pending)'
    """
    if sharding is None:
        return "no layout (pending)"
    if isinstance(sharding, NamedSharding):
        axes = ", ".join(f"{k}={v}" for k, v in sharding.mesh.shape.items())
        spec = tuple(sharding.spec)
        what = " (replicated)" if not any(e is not None for e in spec) else ""
        ids = [d.id for d in sharding.mesh.devices.flat]
        order = "" if ids == sorted(ids) else f" of devices {ids}"
        return f"P{spec}{what} on mesh ({axes}){order}"
    devs = getattr(sharding, "device_set", None)
    if devs is not None and len(devs) == 1:
        return f"on one device ({next(iter(devs))}: unannotated)"
    return str(sharding)


def describe_leaf_key(key: tuple) -> str:
    """A device-data leaf's key ``(DATA, shape, dtype, sharding)`` in words."""
    _, shape, dtype, sharding = key
    return f"{str(dtype).replace('torch.', '')}{list(shape)} {describe(sharding)}"
