"""Unevenly sharded tensors in a compiled call: read through their padded data, written back padded.

A storage laid out unevenly (a dim not divisible by its shard count) holds
``constraint(unpad(padded device data))`` (:mod:`xla_dtensor.core.layout`); at a sync
its new value is padded again and the storage rebound to ``unpad`` of the padded
result. A compiled call does the same: the program reads the padded array (the leaf
under the storage's ``unpad``), writes the padded result, and the replay rebinds the
storage to ``unpad`` of it. Padded values anywhere else (a padded tensor made inside the
function, an uneven output) are not replayed: the call runs lazily.

Example:
    >>> holders_with_padded({})
    ({}, {}, set())
"""
from __future__ import annotations

from typing import Any

from xla_dtensor.core.ir import Node
from xla_dtensor.core import layout as L


def holders_with_padded(before: dict[int, tuple]) -> tuple[dict[int, list], dict[int, list], set[int]]:
    """From ``before`` (storage id -> (weakref, value at the call's start)): ``holders`` (id of a
    value -> [(storage id, weakref)] of the live storages holding it), ``held`` (the same storage
    ids, freed ones included) and the ids of the padded leaves under uneven storages' values,
    which count as held by those storages."""
    holders: dict[int, list] = {}
    held: dict[int, list] = {}
    padded: set[int] = set()
    for sid, (ref, old) in before.items():
        inner = L.padded_source(old)
        ids = (id(old),) if inner is None else (id(old), id(inner))
        if inner is not None:
            padded.add(id(inner))
        for key in ids:
            held.setdefault(key, []).append(sid)
            if ref() is not None:
                holders.setdefault(key, []).append((sid, ref))
    return holders, held, padded


def read_leaf(value: Node) -> Node:
    """The leaf a storage's start value gives the program: its padded data if it is uneven."""
    inner = L.padded_source(value)
    return value if inner is None else inner


def state_unpad(written: list[Any]) -> dict[int, tuple]:
    """Per written storage (index) whose new value is padded (the sticky hook padded it):
    ``(logical shape, logical sharding)`` to rebind it with after the call."""
    out = {}
    for j, s in enumerate(written):
        v = s.value
        if L.is_constraint(v) and v.inputs[0].op == L.PAD:
            out[j] = (s.meta[0], v.sharding)
    return out


def unsupported(order: list[Node], state_roots: list[Node], padded_leaves: set[int]) -> int:
    """How many pad/unpad nodes of a program are not an uneven storage's read or write."""
    ok_pads = {id(r.inputs[0]) for r in state_roots if L.is_constraint(r) and r.inputs[0].op == L.PAD}
    n = 0
    for node in order:
        if node.op == L.UNPAD and id(node.inputs[0]) not in padded_leaves:
            n += 1
        elif node.op == L.PAD and id(node) not in ok_pads:
            n += 1
    return n
