"""Route torch's DTensor API on an ``"xla"`` mesh to xla_dtensor.

For a ``DeviceMesh("xla", ...)`` torch's ``distribute_tensor`` / ``distribute_module``
run ``from torch_xla.distributed.spmd import xla_distribute_tensor`` (resp.
``xla_distribute_module``) inside ``try/except ImportError``. Registering only that
leaf module name in ``sys.modules`` makes the import find our functions, while
``importlib.util.find_spec("torch_xla")`` stays ``None``: libraries probing for
torch_xla are not fooled. With the real torch_xla installed this does nothing.

torch turns *any* ``ImportError`` raised inside the call into "install torch_xla";
ours are re-raised as :class:`~xla_dtensor.spmd.errors.DependencyImportError`
carrying the original message.

Three more entry points have no such hook, so they are wrapped, and the wrappers act
only on ``"xla"`` meshes (every other mesh takes torch's own code unchanged):

* ``DTensor.from_local`` -> :meth:`XLAShardedTensor.from_local` (torch's parallel styles
  call it on every module input and output);
* ``DeviceMesh.__getitem__`` / ``DeviceMesh.mesh``: an xla mesh has no process groups,
  so torch could not slice one (``dm["tp"]``, ``dm["dp", "tp"]``, and a flattened
  ``dm["dp_cp"]``); a sliced mesh's ``.mesh`` is the group holding the root's first
  device (one controller: every group runs the same program);
* ``DeviceMesh.get_group``: a clear error instead of an ``IndexError``;
* ``DeviceMesh.get_coordinate``: the coordinate of this process's first device in the
  mesh (``None`` if it holds none), which DCP's planners ask of every DTensor;
* ``PrepareModuleInput._prepare_input_arg`` / ``PrepareModuleOutput._prepare_out_fn``: on
  an xla mesh they get our sharded tensors (DTensors) as plain lazy tensors, so they
  constrain them to the declared layout instead of reading an undecided one (see
  :mod:`xla_dtensor.spmd.styles`).
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import types
from typing import Any, Callable

from mesh import torch_bridge

LEAF = "torch_xla.distributed.spmd"
_MARK = "__xla_dtensor__"
_log = logging.getLogger("xla_dtensor")


def _surface_import_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        from xla_dtensor.spmd.errors import DependencyImportError
        try:
            return fn(*args, **kwargs)
        except ImportError as e:
            raise DependencyImportError(f"{type(e).__name__}: {e}") from e
    return call


@_surface_import_errors
def xla_distribute_tensor(tensor: Any, device_mesh: Any, placements: Any = None) -> Any:
    """torch's ``distribute_tensor`` for an xla mesh (see :func:`xla_dtensor.distribute_tensor`)."""
    from xla_dtensor.spmd.api import distribute_tensor
    return distribute_tensor(tensor, device_mesh, placements)


@_surface_import_errors
def xla_distribute_module(module: Any, device_mesh: Any = None, partition_fn: Any = None,
                          input_fn: Any = None, output_fn: Any = None) -> Any:
    """torch's ``distribute_module`` for an xla mesh (see :func:`xla_dtensor.distribute_module`)."""
    from xla_dtensor.spmd.module import distribute_module
    return distribute_module(module, device_mesh, partition_fn, input_fn, output_fn)


def real_torch_xla_installed() -> bool:
    own = sys.modules.get(LEAF)
    if own is not None and getattr(own, "__xla_dtensor__", False):
        return False
    try:
        return importlib.util.find_spec("torch_xla") is not None
    except (ImportError, ValueError):
        return False


def install() -> bool:
    """Register the leaf module and the wrappers; returns whether xla_dtensor now serves xla meshes."""
    current = sys.modules.get(LEAF)
    if current is not None and getattr(current, _MARK, False):
        return True
    if real_torch_xla_installed() or current is not None:
        _log.info("torch_xla is installed: torch's DTensor API on 'xla' meshes goes to torch_xla, "
                  "not xla_dtensor (use xla_dtensor.distribute_tensor/distribute_module directly)")
        return False
    mod = types.ModuleType(LEAF, "xla_dtensor's stand-in for torch_xla's DTensor entry points")
    mod.xla_distribute_tensor = xla_distribute_tensor  # type: ignore[attr-defined]
    mod.xla_distribute_module = xla_distribute_module  # type: ignore[attr-defined]
    setattr(mod, _MARK, True)
    sys.modules[LEAF] = mod
    _wrap_torch()
    return True


# -- wrappers for the entry points torch has no hook for ------------------------------
def _is_xla(device_mesh: Any) -> bool:
    from mesh import Mesh
    return isinstance(device_mesh, Mesh) or getattr(device_mesh, "device_type", None) == "xla"


def _current_mesh() -> Any:
    from torch.distributed.device_mesh import _mesh_resources
    stack = getattr(_mesh_resources, "mesh_stack", None)
    return stack[-1] if stack else None


def _coordinate(grid: Any) -> tuple[int, ...] | None:
    """The index in ``grid`` (nested lists of device ids) of this process's first device, else ``None``."""
    import jax
    import numpy as np
    ids = np.asarray(grid)
    mine = {d.id for d in jax.local_devices()}
    for idx in np.ndindex(ids.shape):
        if int(ids[idx]) in mine:
            return tuple(int(i) for i in idx)
    return None


def _wrap_torch() -> None:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor

    def from_local(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(local_tensor: Any, device_mesh: Any = None, placements: Any = None, **kw: Any) -> Any:
            if _is_xla(device_mesh if device_mesh is not None else _current_mesh()):
                from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor
                return XLAShardedTensor.from_local(local_tensor, device_mesh, placements, **kw)
            return orig(local_tensor, device_mesh, placements, **kw)
        return staticmethod(call)

    def getitem(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(self: Any, mesh_dim_names: Any) -> Any:
            if self.device_type != "xla":
                return orig(self, mesh_dim_names)
            names = (mesh_dim_names,) if isinstance(mesh_dim_names, str) else tuple(mesh_dim_names)
            return torch_bridge.slice_xla_mesh(self, names)
        return call

    def mesh(orig: property) -> property:
        @functools.wraps(orig.fget)
        def get(self: Any) -> Any:
            if self.device_type != "xla":
                return orig.fget(self)
            return self._layout.remap_to_tensor(self._rank_map)[0]
        return property(get)

    def get_group(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(self: Any, mesh_dim: Any = None) -> Any:
            if self.device_type == "xla":
                raise RuntimeError(
                    f"{self!r} is an 'xla' mesh: it has no process groups. Under single-controller "
                    "SPMD XLA inserts the collectives from the layouts (placements), so code that "
                    "needs a ProcessGroup (torch's functional collectives, FSDP2 fully_shard, DDP) "
                    "does not run on it; use placements, xla_dtensor.fsdp.shard_model for FSDP")
            return orig(self, mesh_dim)
        return call

    def get_coordinate(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(self: Any) -> Any:
            if self.device_type != "xla":
                return orig(self)
            return _coordinate(self.mesh.tolist())
        return call

    def input_arg(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(self: Any, input: Any, mesh: Any, input_layout: Any, desired_layout: Any) -> Any:  # noqa: A002
            if input_layout is not None and _is_xla(mesh):
                from xla_dtensor.spmd.styles import as_plain
                input = as_plain(input)  # noqa: A001
            return orig(self, input, mesh, input_layout, desired_layout)
        return call

    def out_fn(orig: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(orig)
        def call(self: Any, outputs: Any, device_mesh: Any) -> Any:
            if _is_xla(device_mesh):
                from xla_dtensor.spmd.styles import as_plain
                outputs = as_plain(outputs)
            return orig(self, outputs, device_mesh)
        return call

    from torch.distributed.tensor.parallel import PrepareModuleInput, PrepareModuleOutput
    for cls, name, make in ((DTensor, "from_local", lambda o: from_local(o.__func__)),
                            (DeviceMesh, "__getitem__", getitem), (DeviceMesh, "mesh", mesh),
                            (DeviceMesh, "get_group", get_group), (DeviceMesh, "get_coordinate", get_coordinate),
                            (PrepareModuleInput, "_prepare_input_arg", input_arg),
                            (PrepareModuleOutput, "_prepare_out_fn", out_fn)):
        orig = cls.__dict__[name]
        if not getattr(getattr(orig, "fget", orig), _MARK, False) and not getattr(
                getattr(orig, "__func__", None), _MARK, False):
            new = make(orig)
            setattr(getattr(new, "fget", getattr(new, "__func__", new)), _MARK, True)
            setattr(cls, name, new)
