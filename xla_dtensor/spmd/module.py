"""``distribute_module`` on an ``"xla"`` mesh, and torch's tensor-parallel styles under SPMD.

Semantics (torch's, single-controller): every submodule is passed to
``partition_fn(name, submodule, mesh)``; parameters and buffers it did not distribute
are replicated; ``input_fn(module, inputs, mesh)`` / ``output_fn(module, outputs,
mesh)`` become forward pre-/post-hooks. Activations stay global tensors.

torch's ``ColwiseParallel`` / ``RowwiseParallel`` hand ``distribute_module`` input and
output functions that build DTensors from *local* shards (``DTensor.from_local``).
Under SPMD there are no local shards, so those two functions are recognised and replaced
by sharding constraints on the global activations (the layout they ask for). The model
code needs no change for tensor parallelism (no per-rank head counts).
"""
from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any, Callable

import jax
import torch
from torch import nn

from mesh import Mesh
from xla_dtensor.core.tensor import LazyTensor, new_tensor, value_of
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd import layout as L
from xla_dtensor.spmd.api import distribute_tensor
from xla_dtensor.spmd.errors import AlreadyDistributedError
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor

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
        for name, sub in list(module.named_modules()):
            call(name, sub, mesh_arg)
    _replicate_rest(module, m)
    if input_fn is not None:
        _install_input_fn(module, _translate(input_fn), mesh_arg)
    if output_fn is not None:
        _install_output_fn(module, _translate(output_fn), mesh_arg)
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
    if _n_params(fn) == 2:
        warnings.warn("a 2-argument output_fn(outputs, device_mesh) is deprecated; take "
                      "(module, outputs, device_mesh)", DeprecationWarning, stacklevel=3)
        module.register_forward_hook(lambda mod, inputs, outputs: fn(outputs, mesh))
    else:
        module.register_forward_hook(lambda mod, inputs, outputs: fn(mod, outputs, mesh))


# -- torch tensor-parallel styles ---------------------------------------------------------
def _translate(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Replace torch's Colwise/Rowwise input/output functions by SPMD constraints."""
    if not isinstance(fn, functools.partial):
        return fn
    qual = getattr(fn.func, "__qualname__", "")
    owner = qual.rsplit(".", 1)[0]
    if owner not in ("ColwiseParallel", "RowwiseParallel"):
        return fn
    if qual.endswith("._prepare_input_fn") and len(fn.args) == 2:
        desired = fn.args[1]
        return lambda mod, inputs, mesh: _constrain_first(inputs, mesh, desired)
    if qual.endswith("._prepare_output_fn") and len(fn.args) == 2:
        layouts, use_local = fn.args
        return lambda mod, outputs, mesh: _constrain_output(outputs, mesh, layouts, use_local)
    return fn


def _constrain_first(inputs: tuple, mesh: Any, placements: Any) -> tuple:
    if not inputs or not isinstance(inputs[0], LazyTensor):
        return inputs
    return (constrain_activation(inputs[0], mesh, placements),) + tuple(inputs[1:])


def _constrain_output(outputs: Any, mesh: Any, placements: Any, use_local: bool) -> Any:
    if not isinstance(outputs, LazyTensor):
        return outputs
    out = constrain_activation(outputs, mesh, placements)
    return out if use_local else XLAShardedTensor.wrap(out)


def constrain_activation(x: LazyTensor, mesh: Any, placements: Any) -> LazyTensor:
    """``x`` (differentiably) constrained to ``placements`` on ``mesh``.

    On a sub-mesh (``mesh["tp"]``) the dims the placements leave whole are left to the
    partitioner (``PartitionSpec.UNCONSTRAINED``), so the other mesh axes (say a batch
    split on ``"dp"``) keep what propagation gives them.
    """
    m = A.as_mesh(mesh)
    placements = placements if isinstance(placements, (list, tuple)) else (placements,)
    spec = ShardingSpec.from_placements(m, placements, x.dim()).reduced()
    root = spec.on_root()
    pspec = list(root.to_jax_pspec())
    if m.root is not m:
        pspec = [jax.sharding.PartitionSpec.UNCONSTRAINED if e is None else e for e in pspec]
    sharding = jax.sharding.NamedSharding(root.mesh.jax_mesh(), jax.sharding.PartitionSpec(*pspec))
    return _Constrain.apply(x, sharding)


class _Constrain(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: LazyTensor, sharding: Any) -> LazyTensor:  # noqa: ANN401
        return new_tensor(x._meta, L.constrain(value_of(x), sharding))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None
