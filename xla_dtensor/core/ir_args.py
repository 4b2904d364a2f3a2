"""Reading a lazy IR node back: its output metadata, plain arguments and in-place targets.

A recorded op's ``key`` is ``(op, signature)`` (see :mod:`xla_dtensor.core.signature`):
each lazy tensor appears as its ``(shape, dtype, stride)``, each traced scalar as
``("P", type)``, each 0-dim CPU tensor as ``("cpu0", dtype)``, static Python numbers as
``(type, value)`` and everything else as itself; kwargs follow as ``(name, value)``
pairs. The node's ``inputs`` are the graph inputs in that same order (a random op's
key leaf first). This module walks a signature in that order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from xla_dtensor.core import dispatch as _dispatch
from xla_dtensor.core.ir import DATA, GETITEM, PARAM, Node
from xla_dtensor.core.signature import op_info

TENSOR, SCALAR, CPU0 = "tensor", "scalar", "cpu0"


class ScalarParam(float):
    """A traced Python scalar in a graph's args: its value, but a type-only ``repr``.

    The lazy core hashes such scalars by type (a learning-rate schedule does not
    recompile); ``repr`` does the same so :meth:`autoshard.graph.Graph.fingerprint`
    (and so the plan cache) does not change with the value.

    Example:
        >>> x = ScalarParam(0.5)
        >>> x * 2, repr(x)
        (1.0, 'ScalarParam')
    """

    def __repr__(self) -> str:
        return "ScalarParam"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class Slot:
    """Where graph input ``inputs[i]`` of a node came from: argument ``arg`` (a position
    or a keyword), element ``item`` of a list argument (or None), and its kind."""

    arg: int | str
    item: int | None
    kind: str


def is_op(node: Node) -> bool:
    """Whether ``node`` was recorded by the dispatcher (an aten overload with an entry)."""
    return isinstance(node.op, torch._ops.OpOverload)


def entry(node: Node) -> Any:
    """The signature entry the node was recorded from (its output metadata and kind)."""
    e = _dispatch.entry_for(node.key)
    if e is None:
        raise KeyError(f"no signature entry for IR node {node!r} (op {node.op})")
    return e


def _kind(x: Any) -> str | None:
    if isinstance(x, tuple) and len(x) == 3 and isinstance(x[1], torch.dtype) and isinstance(x[0], tuple):
        return TENSOR
    if isinstance(x, tuple) and len(x) == 2 and x[0] == "P":
        return SCALAR
    if isinstance(x, tuple) and len(x) == 2 and x[0] == "cpu0":
        return CPU0
    return None


def split_key(node: Node) -> tuple[tuple, dict[str, Any]]:
    """The signature as ``(positional, kwargs)``."""
    sig = node.key[1]
    names = {a.name for a in node.op._schema.arguments}
    n = len(sig)
    while n and isinstance(sig[n - 1], tuple) and len(sig[n - 1]) == 2 and isinstance(sig[n - 1][0], str) \
            and sig[n - 1][0] in names and sig[n - 1][0] not in ("P", "cpu0"):
        n -= 1
    return sig[:n], dict(sig[n:])


def layout(node: Node) -> list[Slot]:
    """One :class:`Slot` per entry of ``node.inputs`` (a random op's key leaf is ``("key")``)."""
    pos, kw = split_key(node)
    slots: list[Slot] = [Slot("key", None, "key")] if entry(node).random else []

    def walk(x: Any, arg: int | str, item: int | None) -> None:
        k = _kind(x)
        if k is not None:
            slots.append(Slot(arg, item, k))
        elif _is_list(x):
            for j, y in enumerate(x):
                walk(y, arg, j if item is None else item)

    for i, x in enumerate(pos):
        walk(x, i, None)
    for name, x in kw.items():
        walk(x, name, None)
    return slots


def plain_args(node: Node, only_item: int | None = None) -> tuple[Any, ...]:
    """Positional arguments as :func:`autoshard.fx_builder.graph_from_fx` writes them.

    Tensors (and lists holding tensors) become ``None``, static numbers their value,
    traced scalars a :class:`ScalarParam`, other static values their ``str``. With
    ``only_item=k`` list arguments are replaced by their element ``k`` (a foreach op's
    k-th element).
    """
    pos, _ = split_key(node)
    values = iter(_scalar_values(node))

    def conv(x: Any, pick: bool) -> Any:
        k = _kind(x)
        if k in (TENSOR, CPU0):
            return None
        if k == SCALAR:
            return next(values)
        if isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], type):
            return x[1]
        if isinstance(x, tuple):
            items = [conv(y, False) for y in x]
            if pick:
                return items[only_item]
            return None if any(_kind(y) in (TENSOR, CPU0) for y in x) else tuple(items)
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        return str(x)

    return tuple(conv(x, only_item is not None and _is_list(x)) for x in pos)


def _is_list(x: Any) -> bool:
    return isinstance(x, tuple) and _kind(x) is None and not (len(x) == 2 and isinstance(x[0], type))


def _scalar_values(node: Node) -> list[Any]:
    out = []
    for slot, inp in zip(layout(node), node.inputs):
        if slot.kind == SCALAR:
            v = inp.data
            out.append(ScalarParam(v) if isinstance(v, float) else v)
    return out


def targets(node: Node) -> list[int]:
    """For an in-place op: the ``inputs`` index holding the old value of each mutated tensor,
    in the order of the node's mutated outputs (``outputs[n_ret + i]``)."""
    info = op_info(node.op)
    slots = layout(node)
    out = []
    for pos, name in info.mutated:
        for i, s in enumerate(slots):
            if s.kind == TENSOR and (s.arg == pos or s.arg == name):
                out.append(i)
    return out


def out_metas(node: Node) -> list[tuple | None]:
    """``(shape, dtype)`` of each output of ``node`` (``None`` for an absent optional output)."""
    if node.op == DATA:
        return [(tuple(node.key[1]), node.key[2])]
    if node.op == PARAM:
        return [None]
    if node.op == GETITEM:
        return [out_metas(node.inputs[0])[node.key[1]]]
    if node.op == "convert":
        return [(tuple(node.key[3]), node.key[4])]
    if node.op == "view_scatter":
        return out_metas(node.inputs[0])[:1]
    if is_op(node):
        return [None if m is None else (tuple(m[0]), m[1]) for m in entry(node).outs]
    raise NotImplementedError(f"unknown IR node kind {node.op!r}: {node!r}")
