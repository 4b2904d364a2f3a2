"""``out=`` overloads: run the functional overload, then copy into ``out`` (torch's rules).

``torch.add(x, y, out=o)`` reaches the device as ``aten.add.out``. Its functional twin
is the overload of the same op whose arguments are the out overload's minus the
``out`` tensors (``aten.add.Tensor``); the result is recorded lazily like any op and
copied into ``out``. Unlike CPU, an ``out`` tensor of another shape is not resized
(a lazy tensor's shape is fixed): that raises, and ``out`` stays untouched.

Example:
    >>> import torch, xla_dtensor
    >>> x = torch.ones(3, device=xla_dtensor.device())
    >>> o = torch.empty(3, device=xla_dtensor.device())
    >>> torch.add(x, x, out=o).tolist()
    [2.0, 2.0, 2.0]
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.core.signature import OpInfo
from xla_dtensor.core.tensor import LazyTensor

_FUNCTIONAL: dict[Any, Any] = {}


def functional_of(op: Any) -> Any:
    """The overload of ``op``'s packet taking ``op``'s arguments without the ``out`` tensors, or None."""
    if op in _FUNCTIONAL:
        return _FUNCTIONAL[op]
    schema = op._schema
    outs = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
    want = [(a.name, str(a.type)) for a in schema.arguments if a.name not in outs]
    packet = getattr(torch.ops.aten, schema.name.partition("::")[2], None)
    found = None
    for name in packet.overloads() if packet is not None else ():
        cand = getattr(packet, name)
        args = cand._schema.arguments
        if any(a.alias_info is not None and a.alias_info.is_write for a in args):
            continue
        if [(a.name, str(a.type)) for a in args] == want and len(cand._schema.returns) == len(outs):
            found = cand
            break
    _FUNCTIONAL[op] = found
    return found


def run(op: Any, info: OpInfo, args: tuple, kwargs: dict) -> Any:
    """``op`` (an out= overload) as its functional overload plus a copy into the out tensors."""
    fop = functional_of(op)
    if fop is None:
        raise NotImplementedError(f"{op}: no functional overload takes the same arguments, so this out= variant "
                                  f"is not supported on the jax device; use the functional form")
    names = [name for _, name in info.mutated]
    outs = [kwargs.get(n) for n in names]
    for n, o in zip(names, outs):
        if not isinstance(o, LazyTensor):
            raise TypeError(f"{op}: out= tensor {n!r} must be on the jax device, got {type(o).__name__} on "
                            f"{getattr(o, 'device', None)}")
    res = fop(*args, **{k: v for k, v in kwargs.items() if k not in names})
    results = list(res) if isinstance(res, (tuple, list)) else [res]
    for n, o, r in zip(names, outs, results):  # NOTE: check all before writing any: out stays untouched on error
        if tuple(o.shape) != tuple(r.shape):
            raise RuntimeError(f"{op}: out= tensor {n!r} has shape {list(o.shape)} but the result has shape "
                               f"{list(r.shape)}; the jax device does not resize out= tensors, pass one of the "
                               f"result's shape")
        if not torch.can_cast(r.dtype, o.dtype):
            raise RuntimeError(f"{op}: result type {r.dtype} can't be cast to the desired output type {o.dtype} "
                               f"of out= tensor {n!r}")
    for o, r in zip(outs, results):
        o.copy_(r)
    return outs[0] if len(outs) == 1 else tuple(outs)
