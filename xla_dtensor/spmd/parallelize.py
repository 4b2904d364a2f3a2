"""``parallelize_module``, strict and all-or-nothing.

torch's ``parallelize_module`` warns and skips a plan key that matches no submodule,
and a style that fails half-way (an unsupported module type, a mesh of the wrong
rank) leaves the entries before it applied. This front door checks the whole plan
first and runs torch's own function only when the plan is sound; if torch's function
still raises, every parameter, buffer and hook it changed is put back.

Example:
    >>> import torch
    >>> from torch.distributed.device_mesh import DeviceMesh
    >>> from torch.distributed.tensor.parallel import ColwiseParallel
    >>> mlp = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU())
    >>> try:
    ...     parallelize_module(mlp, DeviceMesh("xla", list(range(4))), {"fc": ColwiseParallel()})
    ... except PlanError as e:
    ...     print(str(e).splitlines()[0])
    plan key 'fc' matches no submodule of Sequential: no child matches 'fc' (children: ['0', '1'])
"""
from __future__ import annotations

from fnmatch import fnmatch
from typing import Any

from torch import nn

from xla_dtensor.sharding.errors import RankError

__all__ = ["PlanError", "parallelize_module"]

_HOOK_DICTS = ("_parameters", "_buffers", "_forward_pre_hooks", "_forward_pre_hooks_with_kwargs",
               "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


class PlanError(KeyError):
    """A ``parallelize_module`` plan key matches no submodule."""

    def __str__(self) -> str:  # KeyError would otherwise quote the message
        return str(self.args[0]) if self.args else ""


def parallelize_module(module: nn.Module, device_mesh: Any = None, parallelize_plan: Any = None, *,
                       src_data_rank: int | None = 0) -> nn.Module:
    """torch's ``parallelize_module`` after checking the whole plan; the module is left
    unchanged when anything fails.

    Raises:
        PlanError: a plan key matches no submodule (names the key, the step that failed
            and the children there).
        NotImplementedError: ``ColwiseParallel`` / ``RowwiseParallel`` on a module they do
            not support (torch's message, with the module's path).
        RankError: ``device_mesh`` is not 1-D (torch's styles give one placement per tensor).
    """
    from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize
    from torch.distributed.tensor.parallel.style import ParallelStyle

    if parallelize_plan is not None:
        _check_mesh(device_mesh)
        items = parallelize_plan.items() if isinstance(parallelize_plan, dict) else [("", parallelize_plan)]
        for key, style in items:
            if not isinstance(style, ParallelStyle):
                raise TypeError(f"plan key {key!r}: expected a ParallelStyle, got {type(style).__name__}")
            for path, sub in _resolve(module, key):
                _check_style(path, sub, style)
    saved = _snapshot(module)
    try:
        return torch_parallelize(module, device_mesh, parallelize_plan, src_data_rank=src_data_rank)
    except BaseException:
        _restore(saved)
        raise


def _check_mesh(device_mesh: Any) -> None:
    ndim = getattr(device_mesh, "ndim", 1)
    if ndim != 1:
        names = getattr(device_mesh, "mesh_dim_names", None)
        raise RankError(f"parallelize_module takes a 1-D mesh (torch's styles give one placement per "
                        f"tensor), got a {ndim}-D mesh with dims {names}; slice it, e.g. "
                        f"device_mesh[{names[-1] if names else 'name'!r}]")


def _resolve(module: nn.Module, key: str) -> list[tuple[str, nn.Module]]:
    """The submodules ``key`` names, matching one ``fnmatch`` token per level (torch's rule)."""
    found = [("", module)]
    for token in key.split(".") if key else []:
        nxt = [(f"{p}.{n}" if p else n, c) for p, m in found for n, c in m.named_children() if fnmatch(n, token)]
        if not nxt:
            where, at = found[0]
            children = [n for n, _ in at.named_children()]
            place = f"{type(module).__name__}" + (f".{where}" if where else "")
            raise PlanError(f"plan key {key!r} matches no submodule of {place}: no child matches "
                            f"{token!r} (children: {children})")
        found = nxt
    return found


def _check_style(path: str, sub: nn.Module, style: Any) -> None:
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
    if not isinstance(style, (ColwiseParallel, RowwiseParallel)) or isinstance(sub, (nn.Linear, nn.Embedding)):
        return
    accepts = getattr(type(style), "_apply", None) not in (ColwiseParallel._apply, RowwiseParallel._apply)
    if accepts:  # a subclass with its own _apply (say Conv1DColwiseParallel) decides itself
        return
    raise NotImplementedError(f"{path or type(sub).__name__} ({type(sub).__name__}): {type(style).__name__} "
                              "currently only support nn.Linear and nn.Embedding!")


def _snapshot(module: nn.Module) -> list[tuple[nn.Module, dict[str, dict], dict[str, Any]]]:
    out = []
    for sub in module.modules():
        dicts = {name: dict(getattr(sub, name)) for name in _HOOK_DICTS if hasattr(sub, name)}
        out.append((sub, dicts, dict(sub.__dict__)))
    return out


def _restore(saved: list[tuple[nn.Module, dict[str, dict], dict[str, Any]]]) -> None:
    for sub, dicts, attrs in saved:
        for name, before in dicts.items():
            store = getattr(sub, name)
            store.clear()
            store.update(before)
        for extra in set(sub.__dict__) - set(attrs):  # say _distribute_module_applied
            del sub.__dict__[extra]
