"""A repeated step's plan, read off the tape instead of walking the graph again.

A training step records the same nodes in the same order between two barriers, and
:func:`executor.make_plan`'s walk of them (~1.7 us a node in Python, 7 ms of a 12-layer
GPT step's 17 ms sync) lays out the same plan every time. :func:`plan` reads the
structure of what was recorded since the last barrier (``ir.recorded()``, creation
order) with C-level maps into one byte string: each node's hash and sharding, its
inputs' tape positions, the leaves read from outside the tape (numbered by first use)
and the roots' positions. A structure seen before gets the plan laid out for it then,
with this step's nodes in place of that step's; any other gets the walk, and is
remembered.

Why it cannot be wrong: the walk is a deterministic function of exactly that structure
(the graph's wiring, every node's hash and sharding, which leaf each input is, the
roots in order), and a program is already identified by node hashes and shardings
(``Plan.struct``). A graph that reaches an op node not on the tape (a pending value
recorded before an earlier partial barrier) is walked. Shardings are coded by value,
as the program cache compares them.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.core import executor
    >>> x = torch.ones(2, device=xla_dtensor.device()) * 3
    >>> len(plan([xla_dtensor.core.tensor.value_of(x)], executor.make_plan).order)
    3
"""
from __future__ import annotations

import itertools
import operator
from typing import Any, Callable, NamedTuple

import numpy as np

from xla_dtensor import metrics
from xla_dtensor.core import native
from xla_dtensor.core.ir import Node, recorded

_INPUTS = operator.attrgetter("inputs")
_HASH = operator.attrgetter("hash")
_SHARDING = operator.attrgetter("sharding")
_FN = operator.attrgetter("fn")
_TIX = operator.attrgetter("tix")
LIMIT = 16  # structures remembered, the least recently used forgotten first (a loop alternates a few)


class _Laid(NamedTuple):
    """A structure's plan in tape positions (a node's position: its tape index, else the tape's
    length plus its number among the leaves read from outside the tape)."""

    plan: Any  # the executor.Plan it was laid out as (its nodes are not used)
    order: tuple[int, ...]
    leaves: tuple[int, ...]


_LAID: dict[tuple, _Laid] = {}
# Equal plan structures as one object. NOTE: two tape structures can lay out the same program (the
# first steps, where the optimizer makes its state, against later ones): with one object the program
# cache compares its key by identity, not ~4,000 entries (0.6-0.9 ms a sync of a 12-layer GPT step).
_STRUCTS: dict[tuple, tuple] = {}


def plan(roots: list[Node], walk: Callable[[list[Node]], Any]) -> Any:
    """``walk(roots)`` (an ``executor.Plan``), from the remembered layout when the tape's structure repeats."""
    found = _structure(roots)
    if found is None:
        return walk(roots)
    key, nodes = found
    laid = _LAID.pop(key, None)
    if laid is not None:
        _LAID[key] = laid  # the most recently used last
        metrics._COUNTS["plans_reused"] += 1
        p = laid.plan

        def fill() -> tuple[list, list, list, list]:
            order = list(map(nodes.__getitem__, laid.order))
            return order, list(map(_FN, order)), list(p.wiring), list(map(_SHARDING, order))
        # NOTE: the node lists only when read (a program not cached, a deferred constraint): 0.3-0.4 ms a GPT step
        return type(p)(p.struct, None, list(map(nodes.__getitem__, laid.leaves)), None, None, None, list(p.outs),
                       fill, lambda i: nodes[laid.order[i]], laid)
    p = walk(roots)
    if len(_STRUCTS) >= 4 * LIMIT:
        _STRUCTS.clear()
    p = p._replace(struct=_STRUCTS.setdefault(p.struct, p.struct))
    at = dict(zip(map(id, nodes), itertools.count()))
    if len(_LAID) >= LIMIT:  # NOTE: not all at once: a new structure then cost every remembered one its walk
        del _LAID[next(iter(_LAID))]
    _LAID[key] = _Laid(p._replace(order=[], leaves=[], fns=[], shardings=[]),
                       tuple(map(at.__getitem__, map(id, p.order))), tuple(map(at.__getitem__, map(id, p.leaves))))
    return p


def _structure(roots: list[Node]) -> tuple[bytes, list[Node]] | None:
    """(the structure of the tape and ``roots``, the tape's nodes then the leaves read from outside it),
    or ``None`` without a tape or when the graph leaves the tape other than through leaves."""
    found = recorded()
    if found is None:
        return None
    if len(_BY_VALUE) >= SHARDINGS_LIMIT:
        _forget()
    tape, base = found
    if _c_structure is not None:  # the same bytes in one C pass (core.native)
        got = _c_structure(tape, base, roots)
        if got is not NotImplemented:
            if got is None:
                return None
            codes = None if _c_codes is None else _c_codes(tape, _CODE_BY_ID)  # (~0.3 ms a GPT step less)
            if codes is None or codes is NotImplemented:
                codes = _sharding_codes(tape).tobytes()
            return got[0] + codes, tape + got[1]
    return _structure_py(tape, base, roots)


def _structure_py(tape: list[Node], base: int, roots: list[Node]) -> tuple[bytes, list[Node]] | None:
    """:func:`_structure` of ``tape`` (its first node's tix ``base``) in Python."""
    n = len(tape)
    ins = list(map(_INPUTS, tape))
    flat = list(itertools.chain.from_iterable(ins))
    wiring = np.fromiter(map(_TIX, flat), np.int64, len(flat)) - base
    outside = np.flatnonzero((wiring < 0) | (wiring >= n)).tolist()
    leaves: list[Node] = []
    if outside:
        first: dict[int, int] = {}  # id -> number, in order of first use
        for i in outside:
            x = flat[i]
            k = first.get(id(x))
            if k is None:
                if x.fn is not None:
                    return None
                k = first[id(x)] = n + len(leaves)
                leaves.append(x)
            wiring[i] = k
    outs = np.fromiter(map(_TIX, roots), np.int64, len(roots)) - base
    if len(roots) and (outs.min() < 0 or outs.max() >= n):
        return None
    nodes = tape + leaves
    key = b"".join([np.array([n, len(leaves), len(flat), len(roots)], np.int64).tobytes(),
                    np.fromiter(map(_HASH, nodes), np.int64, len(nodes)).tobytes(),
                    np.fromiter(map(len, ins), np.int64, n).tobytes(), wiring.tobytes(), outs.tobytes(),
                    _sharding_codes(tape).tobytes()])
    return key, nodes


# A node's sharding by value: equal shardings (torch's DTensor path makes new ones every step) get one
# code. Codes are found by identity first (hashing a NamedSharding runs Python): _CODE_BY_ID maps ids
# to codes in one C-level pass, and _KEPT keeps those objects alive, so their ids are not reused.
_c_structure = native.MODULE.structure if native.ON else None
_c_codes = native.MODULE.sharding_codes if native.ON else None  # None: a sharding without a code yet
_BY_VALUE: dict[Any, int] = {}
_CODE_BY_ID: dict[int, int] = {id(None): 0}
_KEPT: dict[int, Any] = {}
SHARDINGS_LIMIT = 4096


def _sharding_codes(tape: list[Node]) -> np.ndarray:
    shardings = list(map(_SHARDING, tape))
    if shardings.count(None) == len(shardings):  # NOTE: the common case, at C speed (~0.25 ms a GPT step less)
        return np.zeros(len(shardings), np.int64)
    codes = list(map(_CODE_BY_ID.get, map(id, shardings)))
    if None in codes:
        for i, c in enumerate(codes):
            if c is None:
                codes[i] = _code(shardings[i])
    return np.array(codes, np.int64)


def _code(sh: Any) -> int:
    code = _BY_VALUE.get(sh)
    if code is None:
        code = _BY_VALUE[sh] = len(_BY_VALUE) + 1
    if len(_KEPT) >= SHARDINGS_LIMIT:
        _forget_ids()
    _KEPT[id(sh)] = sh
    _CODE_BY_ID[id(sh)] = code
    return code


def _forget() -> None:
    """Start the sharding codes afresh, and with them every remembered structure."""
    _BY_VALUE.clear()
    _forget_ids()
    _LAID.clear()


def _forget_ids() -> None:
    _KEPT.clear()
    _CODE_BY_ID.clear()
    _CODE_BY_ID[id(None)] = 0
