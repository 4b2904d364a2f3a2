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
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import sys
import types
from typing import Any, Callable

LEAF = "torch_xla.distributed.spmd"
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
    """Register the leaf module; returns whether xla_dtensor now serves xla meshes."""
    current = sys.modules.get(LEAF)
    if current is not None and getattr(current, "__xla_dtensor__", False):
        return True
    if real_torch_xla_installed() or current is not None:
        _log.info("torch_xla is installed: torch's DTensor API on 'xla' meshes goes to torch_xla, "
                  "not xla_dtensor (use xla_dtensor.distribute_tensor/distribute_module directly)")
        return False
    mod = types.ModuleType(LEAF, "xla_dtensor's stand-in for torch_xla's DTensor entry points")
    mod.xla_distribute_tensor = xla_distribute_tensor  # type: ignore[attr-defined]
    mod.xla_distribute_module = xla_distribute_module  # type: ignore[attr-defined]
    mod.__xla_dtensor__ = True  # type: ignore[attr-defined]
    sys.modules[LEAF] = mod
    return True
