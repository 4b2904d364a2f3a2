"""The floor of any eager backend built on a Python tensor subclass.

:class:`PassThrough` is a wrapper subclass whose ``__torch_dispatch__`` does nothing but
unwrap its arguments, run torch's own CPU kernel and wrap the results: no IR, no cache
key, no executable. Whatever a training step costs with it is what torch's Python
subclass dispatch and autograd cost with zero-cost kernels, the least an eager mode like
``xla_dtensor.eager_mode`` (one Python dispatch per op, then a device executable) can
take on the same machine. ``trace_overhead.py`` times it next to eager mode.

Example:
    >>> import torch
    >>> from benchmarks._subclass_floor import PassThrough, unwrap
    >>> unwrap(PassThrough(torch.ones(2)) * 3)
    tensor([3., 3.])
"""
from __future__ import annotations

from typing import Any

import torch


class PassThrough(torch.Tensor):
    """A CPU tensor seen through a Python ``__torch_dispatch__`` that only forwards (see the module)."""

    elem: torch.Tensor

    @staticmethod
    def __new__(cls, elem: torch.Tensor) -> PassThrough:
        r = torch.Tensor._make_wrapper_subclass(cls, elem.shape, strides=elem.stride(),
                                                storage_offset=elem.storage_offset(), dtype=elem.dtype,
                                                device=elem.device, requires_grad=elem.requires_grad)
        r.elem = elem
        return r

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        # NOTE: flat loops, not pytree: tree_map on every op took the GPT-2 step from ~6 to ~11 ms
        a = [_inner(x) if type(x) is not list else [_inner(y) for y in x] for x in args]
        out = func(*a, **{k: _inner(v) for k, v in kwargs.items()}) if kwargs else func(*a)
        if type(out) is torch.Tensor:
            return PassThrough(out)
        if type(out) in (tuple, list):
            return type(out)(_outer(o) if type(o) is not list else [_outer(q) for q in o] for o in out)
        return out

    def __repr__(self) -> str:  # the default repr dispatches ops on the wrapper's (empty) storage
        return f"PassThrough({self.elem!r})"


def _inner(x: Any) -> Any:
    return x.elem if type(x) is PassThrough else x


def _outer(x: Any) -> Any:
    return PassThrough(x) if type(x) is torch.Tensor else x


def unwrap(t: torch.Tensor) -> torch.Tensor:
    """The plain CPU tensor behind ``t`` (``t`` itself if it is not wrapped), detached."""
    return (t.elem if type(t) is PassThrough else t).detach()


def wrap_parameters(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` with every parameter replaced by a :class:`PassThrough` parameter, in place.

    A parameter shared by several modules (tied embeddings) stays one parameter.
    """
    new: dict[int, torch.nn.Parameter] = {}
    for m in module.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                if id(p) not in new:
                    new[id(p)] = torch.nn.Parameter(PassThrough(p.detach()), requires_grad=p.requires_grad)
                m._parameters[name] = new[id(p)]
    return module
