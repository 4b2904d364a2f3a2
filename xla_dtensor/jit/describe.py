"""Recorded programs in words, for the messages of ``compile``: which tensor, which op, which layout.

A program is described by, per node in topological order, its op name and its key (an
op's key is ``(aten overload, argument signature)``, where a tensor argument appears as
``(shape, dtype, stride)``; a device-data leaf's key is ``(DATA, shape, dtype, sharding)``),
its wiring, and per leaf the name of the tensor it is read from.

Example:
    >>> import torch
    >>> arg(((2, 3), torch.float32, (3, 1)))
    'float32[2, 3]'
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.core.ir import DATA, PARAM
from xla_dtensor.jit.layouts import describe as describe_layout
from xla_dtensor.jit.layouts import describe_leaf_key


def arg(a: Any) -> str:
    """One entry of an op's argument signature in words."""
    if isinstance(a, tuple) and len(a) == 3 and isinstance(a[1], torch.dtype):
        return f"{str(a[1]).replace('torch.', '')}{list(a[0])}"
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "P":
        return f"{a[1].__name__} scalar"
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], type):
        return repr(a[1])
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], str) and a[0] != "cpu0":
        return f"{a[0]}={arg(a[1])}"
    if isinstance(a, tuple):
        return "(" + ", ".join(arg(x) for x in a) + ")"
    return repr(a)


def node(i: int, ops: list[str], keys: list[Any], names: dict[int, str | None]) -> str:
    """Node ``i`` of a program: a leaf as the tensor it reads and its layout, an op with its arguments."""
    key = keys[i]
    if ops[i] == DATA and isinstance(key, tuple) and len(key) == 4:
        who = names.get(i) or "an unnamed tensor (made inside the function, or not reached from the arguments)"
        return f"input {who}: {describe_leaf_key(key)}"
    if ops[i] == PARAM:
        return f"Python {key[1].__name__} scalar"
    if ops[i] == "sharding_constraint":
        return f"a sharding constraint to {describe_layout(key[1])}"
    if isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], tuple):
        return f"{ops[i]}({', '.join(arg(a) for a in key[1])})"
    return f"{ops[i]} {key!r}"


def first_difference(old: tuple, new: tuple) -> str:
    """Where two programs first differ, in words.

    ``old`` and ``new`` are ``(struct, ops, keys, names)`` with ``names``: node position ->
    tensor name for the leaves.
    """
    (a, ops_a, keys_a, names_a), (b, ops_b, keys_b, names_b) = old, new
    for i in range(min(len(a), len(b))):
        if a[i] != b[i]:
            was, now = node(i, ops_a, keys_a, names_a), node(i, ops_b, keys_b, names_b)
            if was == now:  # same op and arguments: an input of it differs
                return f"node {i} ({now}) reads different inputs than when traced"
            return f"graph differs at node {i}: was {was}; now {now}"
    return f"graph has {len(b)} nodes, was {len(a)} (the first {min(len(a), len(b))} are equal)"


def mismatch(name: str | None, key: tuple, value: Any) -> str:
    """Why a program input no longer fits: the tensor, its traced layout and the one it has now.

    ``key``: the traced leaf's key; ``value``: the IR node the tensor holds now.
    """
    who = name or "a tensor the function reads"
    if value.fn is not None:
        now = "a pending value (ops recorded on it outside the function, not yet run)"
    elif value.op != DATA:
        now = f"a {value.op} value"
    else:
        now = describe_leaf_key(value.key)
    was = describe_leaf_key(key)
    if was == now:  # equal in words, not as objects (say a mesh's axis types)
        was, now = f"{was} [{key[3]!r}]", f"{now} [{value.key[3]!r}]"
    return f"{who}: traced as {was}, now {now}"
