"""``distribute_module`` on an ``"xla"`` mesh, and torch's tensor-parallel styles under SPMD.

Semantics (torch's, single-controller): every submodule is passed to
``partition_fn(name, submodule, mesh)``; parameters and buffers it did not distribute
are replicated; ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs,
mesh)`` become forward pre-/post-hooks. Activations stay global tensors, so model code
needs no change for tensor parallelism (no per-rank head counts). How torch's parallel
styles run here: :mod:`xla_dtensor.spmd.styles`.
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Callable

from torch import nn

from mesh import Mesh
from xla_dtensor.sharding import ShardingError
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd.api import distribute_tensor
from xla_dtensor.spmd.errors import AlreadyDistributedError
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor
from xla_dtensor.spmd.styles import constrain_activation, translate

__all__ = ["AUTO", "constrain_activation", "distribute_module"]

AUTO = "AUTO"


def distribute_module(module: nn.Module, device_mesh: Any = None,
                      partition_fn: Callable[..., None] | str | None = None,
                      input_fn: Callable[..., Any] | None = None,
                      output_fn: Callable[..., Any] | None = None) -> nn.Module:
    """Distribute ``module``'s parameters and buffers on ``device_mesh`` (in place; returned).

    Args:
        module: the module (CPU or jax device).
        device_mesh: torch ``DeviceMesh("xla", ...)``, :class:`mesh.Mesh` or ``None`` (global).
        partition_fn: ``fn(name, submodule, device_mesh)`` that distributes the submodule's
            parameters (``distribute_tensor`` + ``register_parameter``); a 2-argument
            ``fn(name, submodule)`` is accepted with a ``DeprecationWarning``. ``None``
            replicates everything. ``"AUTO"`` or an :class:`~xla_dtensor.spmd.auto.AutoPolicy`:
            the auto-sharder chooses every parameter's layout at the first training step's
            ``sync()`` (see :mod:`xla_dtensor.spmd.auto`).
        input_fn: ``fn(module, inputs, device_mesh)`` run before ``forward``.
        output_fn: ``fn(module, outputs, device_mesh)`` run after ``forward``.

    Raises:
        AlreadyDistributedError: the module was distributed before.
        MeshDevicesError: the mesh names devices JAX does not have (the module is untouched).

    Example:
        >>> from torch import nn
        >>> from mesh import Mesh
        >>> lin = distribute_module(nn.Linear(4, 8), Mesh(range(8), (8,), ("x",)))
        >>> lin.weight.placements
        (Replicate(),)
    """
    if getattr(module, "_distribute_module_applied", False):
        raise AlreadyDistributedError(
            f"distribute_module should only be called once on a module, but "
            f"{type(module).__name__} has already been distributed")
    m = A.as_mesh(device_mesh)
    mesh_arg = device_mesh if device_mesh is not None else m
    if isinstance(partition_fn, str):
        if partition_fn != AUTO:
            raise ValueError(f"partition_fn must be a callable, None or 'AUTO', got {partition_fn!r}")
        from xla_dtensor.spmd.auto import AUTO as partition_fn
    from xla_dtensor.spmd.auto import AutoPolicy, prepare_module
    if isinstance(partition_fn, AutoPolicy):
        prepare_module(module, m, partition_fn)
        partition_fn = None
    if partition_fn is not None:
        call = _partition_caller(partition_fn)
        saved = _tensors_of(module)
        name = ""
        try:
            for name, sub in list(module.named_modules()):
                call(name, sub, mesh_arg)
        except BaseException as e:
            _restore(saved)  # NOTE: a failing partition_fn leaves the module as it was
            if isinstance(e, ShardingError) and len(e.args) == 1:
                where = f"{type(module).__name__}" + (f".{name}" if name else "")
                raise type(e)(f"distribute_module: partition_fn on {where}: {e}") from e
            raise
    _replicate_rest(module, m)
    if input_fn is not None:
        _install_input_fn(module, translate(input_fn), mesh_arg)
    if output_fn is not None:
        _install_output_fn(module, translate(output_fn), mesh_arg)
    module._distribute_module_applied = True  # type: ignore[assignment]
    return module


def _n_params(fn: Callable[..., Any]) -> int | None:
    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind in (p.VAR_POSITIONAL,) for p in ps):
        return None
    return sum(1 for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))


def _partition_caller(fn: Callable[..., None]) -> Callable[[str, nn.Module, Any], None]:
    if _n_params(fn) == 2:
        warnings.warn("a 2-argument partition_fn(name, module) is deprecated; take "
                      "(name, module, device_mesh)", DeprecationWarning, stacklevel=3)
        return lambda name, sub, mesh: fn(name, sub)
    return fn


def _tensors_of(module: nn.Module) -> list[tuple[dict, dict]]:
    return [(sub._parameters, dict(sub._parameters)) for sub in module.modules()] + \
           [(sub._buffers, dict(sub._buffers)) for sub in module.modules()]


def _restore(saved: list[tuple[dict, dict]]) -> None:
    for store, before in saved:
        store.clear()
        store.update(before)


def _replicate_rest(module: nn.Module, m: Mesh) -> None:
    """Replicate every parameter/buffer not yet distributed (tied ones stay tied)."""
    done: dict[int, Any] = {}
    for sub in module.modules():
        for store, is_param in ((sub._parameters, True), (sub._buffers, False)):
            for key, t in list(store.items()):
                if t is None or isinstance(t, XLAShardedTensor):
                    continue
                new = done.get(id(t))
                if new is None:
                    d = distribute_tensor(t.detach(), m, None)
                    new = nn.Parameter(d, requires_grad=t.requires_grad) if is_param else d
                    done[id(t)] = new
                store[key] = new


def _install_input_fn(module: nn.Module, fn: Callable[..., Any], mesh: Any) -> None:
    if _n_params(fn) == 2:
        warnings.warn("a 2-argument input_fn(inputs, device_mesh) is deprecated; take "
                      "(module, inputs, device_mesh)", DeprecationWarning, stacklevel=3)
        module.register_forward_pre_hook(lambda mod, inputs: fn(inputs, mesh))
    else:
        module.register_forward_pre_hook(lambda mod, inputs: fn(mod, inputs, mesh))


def _install_output_fn(module: nn.Module, fn: Callable[..., Any], mesh: Any) -> None:
    if getattr(fn, "takes_inputs", False):  # a translated style output (styles.translate)
        module.register_forward_hook(lambda mod, inputs, outputs: fn(mod, outputs, mesh, inputs))
    elif _n_params(fn) == 2:
        warnings.warn("a 2-argument output_fn(outputs, device_mesh) is deprecated; take "
                      "(module, outputs, device_mesh)", DeprecationWarning, stacklevel=3)
        module.register_forward_hook(lambda mod, inputs, outputs: fn(outputs, mesh))
    else:
        module.register_forward_hook(lambda mod, inputs, outputs: fn(mod, outputs, mesh))
