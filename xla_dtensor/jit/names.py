"""Names of the tensors a compiled call reads, for messages: parameter names, optimizer slots.

Example:
    >>> import torch
    >>> lin = torch.nn.Linear(2, 2)
    >>> sorted(tensor_names([lin]).values())
    ['bias', 'weight']
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.core.tensor import storage_of


def _key(t: torch.Tensor) -> int:
    storage = getattr(t, "_storage", None)
    return id(storage) if storage is not None else id(t)


def tensor_names(flat: list[Any]) -> dict[int, str]:
    """``id(storage) -> name`` for the tensors ``flat`` (a call's flattened arguments) reaches.

    Module parameters and buffers by their qualified names, optimizer state as
    ``"<slot> of <parameter>"`` (a parameter no module names is ``param_groups[g][i]``),
    tensor arguments as ``"argument #k"``.
    """
    names: dict[int, str] = {}
    for k, x in enumerate(flat):
        if isinstance(x, torch.nn.Module):
            for n, p in x.named_parameters(remove_duplicate=False):
                names.setdefault(_key(p), n)
            for n, b in x.named_buffers(remove_duplicate=False):
                names.setdefault(_key(b), n)
    for k, x in enumerate(flat):
        if isinstance(x, torch.optim.Optimizer):
            for g, group in enumerate(x.param_groups):
                for i, p in enumerate(group["params"]):
                    pname = names.setdefault(_key(p), f"param_groups[{g}][{i}]")
                    for slot, t in x.state.get(p, {}).items():
                        if isinstance(t, torch.Tensor):
                            names.setdefault(_key(t), f"optimizer state {slot!r} of {pname}")
        elif isinstance(x, torch.Tensor):
            names.setdefault(_key(x), f"argument #{k}")
    return names


def leaf_names(sources: list[tuple], names: dict[int, str], flat: list[Any]) -> list[str | None]:
    """Per program leaf (its source, :mod:`xla_dtensor.jit.capture`), the name of the tensor it is
    read from (``None``: unnamed, or not a tensor)."""
    out: list[str | None] = []
    for src in sources:
        kind = src[0]
        if kind == "arg":
            out.append(names.get(id(storage_of(flat[src[1]])), f"argument #{src[1]}"))
        elif kind == "cap":
            s = src[1]()
            out.append(names.get(id(s)) if s is not None else None)
        elif kind == "grad":
            p = src[1][0][0]()
            out.append(f"gradient of {names.get(id(storage_of(p)), 'a parameter')}" if p is not None else None)
        else:
            out.append(None)
    return out
