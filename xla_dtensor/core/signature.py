"""Per-op schema facts and the argument signature of one call.

The signature of a call is a hashable tuple in which every lazy tensor appears as its
metadata ``(shape, dtype, stride)`` and every value scalar (a schema ``Scalar``, or a
Python number where a ``Tensor`` goes) other than 0 and 1 appears as its type only: its
value becomes a graph parameter. Everything else (dims, sizes, flags, dtypes) is static
and appears as itself. Shape inference is cached per (op, signature).
"""
from __future__ import annotations

import operator
from itertools import repeat
from typing import Any

import numpy as np
import torch

from xla_dtensor import metrics
from xla_dtensor.core.ir import Node, data_leaf, param_leaf
from xla_dtensor.ops.registry import traced_float_names
from xla_dtensor.core.tensor import SUBCLASSES as _SUBCLASSES, LazyTensor, value_of

_SCALAR_TYPES = frozenset({"number", "Optional[number]", "List[number]", "Tensor", "Optional[Tensor]"})
_PTYPE = {float: ("P", float), int: ("P", int), complex: ("P", complex)}


class OpInfo:
    """What the dispatcher needs to know about an aten overload's schema."""

    __slots__ = ("scalar_pos", "scalar_kw", "view", "mutated", "out_kw", "returns_alias", "n_returns", "scalar_flags",
                 "no_flags")

    def __init__(self, op: Any) -> None:
        schema = op._schema
        args = schema.arguments
        self.scalar_pos = frozenset(i for i, a in enumerate(args) if not a.kwarg_only and str(a.type) in _SCALAR_TYPES)
        self.scalar_flags = tuple(i in self.scalar_pos for i in range(len(args)))  # per position: a value scalar?
        self.no_flags = (False,) * len(args)
        traced = traced_float_names(op)  # float hyperparameters its lowering takes traced (fused optimizers)
        self.scalar_kw = frozenset(a.name for a in args if a.kwarg_only and (
            str(a.type) in _SCALAR_TYPES or (a.name in traced and str(a.type) == "float")))
        # mutated arguments: (position, None) or (None, keyword name)
        self.mutated = tuple((i if not a.kwarg_only else None, a.name) for i, a in enumerate(args)
                             if a.alias_info is not None and a.alias_info.is_write)
        self.out_kw = all(i is None for i, _ in self.mutated) and bool(self.mutated)
        rets = schema.returns
        self.returns_alias = tuple(r.alias_info is not None for r in rets)
        self.n_returns = len(rets)
        self.view = bool(rets) and not self.mutated and any(self.returns_alias)


_INFOS: dict[int, OpInfo] = {}  # id(op) -> its info (which holds the op): see core.optable


def op_info(op: Any) -> OpInfo:
    info = _INFOS.get(id(op))
    if info is None:
        info = _INFOS[id(op)] = OpInfo(op)
    return info


class MixedDeviceError(RuntimeError):
    """A CPU tensor (not 0-dim) and a jax tensor in one op."""


def _cpu_scalar_leaf(t: torch.Tensor) -> Node:
    import jax
    from xla_dtensor.core.dtypes import to_jax
    metrics._COUNTS["transfers_to_device"] += 1
    arr = jax.device_put(np.array(t.detach().numpy(), dtype=to_jax(t.dtype), copy=True))
    return data_leaf(arr, (), t.dtype)


_META = operator.attrgetter("_meta")
_ROOT_VALUE = operator.attrgetter("_storage.value")
_CHAIN = operator.attrgetter("_chain")


def roots_only(a: list | tuple) -> bool:
    """Whether every item of ``a`` is a lazy tensor that is not a view (its value is its storage's)."""
    types = set(map(type, a))
    return all(t is LazyTensor or t in _SUBCLASSES for t in types) and not any(map(_CHAIN, a))


def _arg(a: Any, scal: bool, dyn: list[Node]) -> Any:
    tp = type(a)
    if tp is LazyTensor:
        dyn.append(value_of(a) if a._chain else a._storage.value)  # (a root's value, inlined)
        return a._meta
    if tp is float or tp is int or tp is complex:
        if scal and a != 0 and a != 1:
            dyn.append(param_leaf(a))
            return _PTYPE[tp]
        return (tp, a)
    if tp is list or tp is tuple:
        if len(a) > 8 and roots_only(a):  # NOTE: a fused optimizer's or foreach op's lists, at C speed (~0.3 ms a GPT step)
            dyn.extend(map(_ROOT_VALUE, a))
            return tuple(map(_META, a))
        return tuple([_arg(x, scal, dyn) for x in a])
    if tp in _SUBCLASSES:
        dyn.append(value_of(a) if a._chain else a._storage.value)
        return a._meta
    if isinstance(a, torch.Tensor):  # not a lazy tensor: every LazyTensor subclass is in _SUBCLASSES
        if a.dim() == 0 and a.device.type == "cpu":
            dyn.append(_cpu_scalar_leaf(a))
            return ("cpu0", a.dtype)
        raise MixedDeviceError(
            f"Expected all tensors to be on the same device, but found at least two devices, "
            f"jax:0 and {a.device}!")
    return a


def signature(args: tuple, kwargs: dict, info: OpInfo, scalars: bool, dyn: list[Node]) -> tuple:
    """The call's signature; appends the graph inputs (tensor values, parameters) to ``dyn``."""
    # NOTE: a map, not a comprehension (a function frame per op in Python 3.11)
    flags = info.scalar_flags if scalars else info.no_flags
    if len(args) > len(flags):  # (more than the schema has: a caller's mistake, torch's error at inference)
        flags = flags + (False,) * (len(args) - len(flags))
    key = tuple(map(_arg, args, flags, repeat(dyn)))
    if kwargs:
        sk = info.scalar_kw if scalars else ()
        key += tuple([(k, _arg(v, k in sk, dyn)) for k, v in kwargs.items()])
    return key


class Slot:
    """Placeholder for the ``i``-th graph input in an argument template."""

    __slots__ = ("i",)

    def __init__(self, i: int) -> None:
        self.i = i


def template(args: tuple, kwargs: dict, info: OpInfo, scalars: bool) -> tuple[tuple, dict, list]:
    """``(args, kwargs, abstract)`` with graph inputs replaced by :class:`Slot` s.

    ``abstract`` lists each input's abstract value for ``jax.eval_shape``, in the order
    :func:`signature` appends them.
    """
    import jax
    from xla_dtensor.core.dtypes import to_jax
    abstract: list[Any] = []

    def tmpl(a: Any, scal: bool) -> Any:
        if isinstance(a, LazyTensor):
            abstract.append(jax.ShapeDtypeStruct(a._meta[0], to_jax(a._meta[1])))
            return Slot(len(abstract) - 1)
        if type(a) in (float, int, complex) and scal and a != 0 and a != 1:
            abstract.append(a)
            return Slot(len(abstract) - 1)
        if isinstance(a, (list, tuple)):
            return [tmpl(x, scal) for x in a]
        if isinstance(a, torch.Tensor):  # 0-dim CPU tensor
            abstract.append(jax.ShapeDtypeStruct((), to_jax(a.dtype)))
            return Slot(len(abstract) - 1)
        return a

    sp = info.scalar_pos if scalars else ()
    targs = tuple(tmpl(a, i in sp) for i, a in enumerate(args))
    sk = info.scalar_kw if scalars else ()
    tkwargs = {k: tmpl(v, k in sk) for k, v in kwargs.items()}
    return targs, tkwargs, abstract


def fill(t: Any, vals: tuple) -> Any:
    """Replace the :class:`Slot` s in template ``t`` by ``vals``."""
    if type(t) is Slot:
        return vals[t.i]
    if type(t) is list:
        return [fill(x, vals) for x in t]
    return t


# The same signature in C (core.native), chosen once at import.
from xla_dtensor.core import native as _native  # noqa: E402

PYTHON = {"signature": signature}  # the Python path's, kept for tests comparing the two paths

if _native.ON:
    _native.MODULE.configure_signature(LazyTensor, _SUBCLASSES, value_of, _arg, _PTYPE, globals())
    signature = _native.MODULE.signature  # noqa: F811
