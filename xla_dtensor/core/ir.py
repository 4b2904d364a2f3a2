"""The lazy IR: hash-consed nodes, device-data leaves and scalar parameters.

A :class:`Node` is an immutable SSA value. Its ``hash`` combines the op, its static
arguments and its inputs' hashes, computed once at construction. Leaves hash by
metadata only: device data by (shape, dtype, sharding), scalar parameters by Python
type, never by content, so the same training step has the same graph hash every time.

Identical (op, static arguments, input objects) return the same node object
(hash-consing, which also gives common-subexpression elimination for free).
"""
from __future__ import annotations

import itertools
import operator
import sys
from typing import Any, Callable, Iterable

from xla_dtensor import metrics
from xla_dtensor.core.state import STATE

DATA, PARAM, GETITEM = "data", "param", "getitem"
_HASH = operator.attrgetter("hash")  # NOTE: a map over it, not a comprehension (a function frame in 3.11)
_SEQ = itertools.count()


class Node:
    """One value of the lazy graph.

    ``fn(*input_values)`` computes it inside the traced JAX function; leaves have
    ``fn is None`` and carry ``data`` (a ``jax.Array`` / numpy array, or a Python scalar
    for parameters; ``raw`` is the object stored, which for a member of a packed array is its
    :class:`~xla_dtensor.core.packs.Pack`, and ``data`` then unpacks the member's own array). ``sharding`` is an
    optional constraint applied after ``fn``. ``seq``
    counts creation: a node's inputs have smaller ``seq`` (recording order, which the AUTO
    graph writer keeps so layer clustering sees forward, backward and optimizer in turn).
    """

    __slots__ = ("op", "key", "inputs", "hash", "fn", "raw", "sharding", "seq", "tix", "__weakref__")

    def __init__(self, op: Any, key: Any, inputs: tuple[Node, ...], h: int,
                 fn: Callable[..., Any] | None, data: Any = None) -> None:
        self.op, self.key, self.inputs, self.hash, self.fn, self.raw = op, key, inputs, h, fn, data
        self.sharding = None
        self.seq = next(_SEQ)
        self.tix = -1  # its place on the tape (see recorded), when taped

    @property
    def is_leaf(self) -> bool:
        return self.fn is None

    @property
    def data(self) -> Any:
        raw = self.raw
        return PACKED[1](self) if type(raw) is PACKED[0] else raw

    @data.setter
    def data(self, value: Any) -> None:
        self.raw = value

    def __repr__(self) -> str:
        kind = "leaf" if self.fn is None else f"{len(self.inputs)} inputs"
        return f"Node({self.op}, {kind}, hash={self.hash & 0xffffffff:08x})"


# (the type of a packed member's raw data, the function reading its array): set by core.packs
PACKED: list[Any] = [None, None]


# NOTE: a plain dict, emptied at every barrier (see clear_cons) and when it passes CONS_LIMIT
# entries. A WeakValueDictionary cost ~2.5 us per recorded node (a KeyedRef made on insert,
# a Python callback on the node's death at sync): a sixth of a lazy GPT step's host time
# (benchmarks/lazy_overhead.py). Holding the nodes strongly keeps each key's input ids
# valid (a node keeps its inputs alive) until the entry goes; a step records the same
# entries between the same barriers every time, so the graphs, and their programs, repeat.
_CONS: dict[tuple, Node] = {}
CONS_LIMIT = 1 << 16
# The tape: the op nodes made since the last barrier, the scalar parameters recorded and the storages'
# new leaves of the barrier, in creation order (core.plan_cache reads a repeated step's plan off it).
# A taped node's ``tix`` is _BASE plus its index; _BASE moves on at each barrier, so an older node's
# tix is out of range. Past TAPE_LIMIT nodes the tape is dropped until the next barrier (``None``):
# a program that never syncs does not keep every node alive.
_TAPE: list[Node] | None = []
_BASE = 0
TAPE_LIMIT = 1 << 18


def clear_cons() -> None:
    """Forget the hash-consing table and start a new tape (at a barrier: the pending graph they index
    has been computed)."""
    global _TAPE, _BASE
    _CONS.clear()
    _TAPE = []
    _BASE += 1 << 32


def partial_barrier() -> None:
    """Forget the hash-consing table and start a new tape holding the old tape's live nodes (at a host read:
    only the value read has been computed).

    The step's other pending values stay on the tape, so the sync that computes them reads its plan off the
    tape (``core.plan_cache``) instead of walking a graph that leaves it: transformers' masks read a value to
    the host in every forward. Only the nodes something else still holds are kept; scanning from the newest,
    a dropped node releases its inputs before they are looked at, so a loop of host reads without ``sync()``
    keeps no dead step's nodes, nor the inputs they read.
    """
    global _TAPE
    old = _TAPE
    clear_cons()
    if old is None:
        return
    kept = []
    for i in range(len(old) - 1, -1, -1):
        node = old[i]
        old[i] = None
        if sys.getrefcount(node) > 2:  # NOTE: 2: ``node`` here and getrefcount's argument
            kept.append(node)
    node = None
    kept.reverse()
    for i, node in enumerate(kept):
        node.tix = _BASE + i
    _TAPE = kept


def recorded() -> tuple[list[Node], int] | None:
    """(the tape, the ``tix`` of its first node), or ``None`` when more than ``TAPE_LIMIT`` were recorded."""
    return None if _TAPE is None else (_TAPE, _BASE)


def tape(nodes: Iterable[Node]) -> None:
    """Put ``nodes`` (leaves: the storages' new values at a barrier, scalar parameters) on the tape."""
    t = _TAPE
    if t is not None:
        for node in nodes:
            node.tix = _BASE + len(t)
            t.append(node)
        if len(t) > TAPE_LIMIT:
            _drop_tape()


def _drop_tape() -> None:
    global _TAPE
    _TAPE = None


def make_node(op: Any, key: Any, key_hash: int, inputs: tuple[Node, ...], fn: Callable[..., Any]) -> Node:
    """The node computing ``fn(*inputs)``; an identical node recorded since the last barrier is reused.

    ``key`` (hashable, with hash ``key_hash``) must determine ``fn`` exactly.
    With ``STATE.consing`` off every call makes a new node: eager mode computes each op's
    outputs at once, so there is no pending graph to share nodes in.
    """
    if not STATE.consing:
        metrics._COUNTS["ops_recorded"] += 1
        return Node(op, key, inputs, hash((key_hash, *map(_HASH, inputs))), fn)
    ck = (key_hash, *map(id, inputs))
    node = _CONS.get(ck)
    if node is not None and node.key == key:
        metrics._COUNTS["hash_cons_hits"] += 1
        return node
    node = Node(op, key, inputs, hash((key_hash, *map(_HASH, inputs))), fn)
    if len(_CONS) >= CONS_LIMIT:
        _CONS.clear()
    _CONS[ck] = node
    t = _TAPE
    if t is not None:
        node.tix = _BASE + len(t)
        t.append(node)
        if len(t) > TAPE_LIMIT:
            _drop_tape()
    metrics._COUNTS["ops_recorded"] += 1
    return node


# (id of a sharding, shape, dtype) -> (that sharding, the leaf key, its hash): a sync rebinds ~1,800
# storages of a GPT step to new leaves, and hashing a NamedSharding runs Python (~1 us each).
# The sharding is kept so its id cannot be reused while the entry lives.
_LEAF_KEYS: dict[tuple, tuple] = {}


def canonical(sharding: Any) -> Any:
    """``sharding`` spelled one way: a ``NamedSharding``'s spec without trailing ``None`` s.

    NOTE: XLA hands its outputs' layouts back in either spelling (``P()`` or ``P(None, None)``
    for a replicated matrix, depending on the program): hashed as they are, they made two
    programs of one step (an AUTO-planned BERT's third step compiled again). A leaf's hash (a
    program's identity) takes this spelling; its key keeps the array's own (for messages). An
    executable takes arrays of either spelling.
    """
    spec = getattr(sharding, "spec", None)
    if not spec or spec[-1] is not None or getattr(spec, "unreduced", None) or getattr(spec, "reduced", None):
        return sharding
    from jax.sharding import NamedSharding, PartitionSpec
    parts = list(spec)
    while parts and parts[-1] is None:
        parts.pop()
    return NamedSharding(sharding.mesh, PartitionSpec(*parts), memory_kind=sharding.memory_kind)


def data_leaf(array: Any, shape: tuple[int, ...], dtype: Any) -> Node:
    """A device-data leaf holding ``array``; hashed by (shape, dtype, sharding)."""
    sharding = getattr(array, "sharding", None)
    ck = (id(sharding), shape, dtype)
    hit = _LEAF_KEYS.get(ck)
    if hit is None or hit[0] is not sharding:
        if len(_LEAF_KEYS) >= CONS_LIMIT:
            _LEAF_KEYS.clear()
        key = (DATA, shape, dtype, sharding)  # hashed by the layout's one spelling (see canonical)
        hit = _LEAF_KEYS[ck] = (sharding, key, hash((DATA, shape, dtype, canonical(sharding))))
    return Node(DATA, hit[1], (), hit[2], None, array)


def param_leaf(value: int | float | complex) -> Node:
    """A scalar-parameter leaf: its value is a graph input, not a constant."""
    key = (PARAM, type(value))
    node = Node(PARAM, key, (), hash(key), None, value)
    if STATE.consing:
        tape((node,))
    return node


_GETITEMS: list[tuple[tuple, int, Callable[[Any], Any]]] = []  # [i] -> (key, its hash, fn)


def _getitem_table(n: int) -> list[tuple[tuple, int, Callable[[Any], Any]]]:
    """The getitem entries of outputs ``0 .. n-1`` (and more)."""
    for i in range(len(_GETITEMS), n):
        key = (GETITEM, i)
        _GETITEMS.append((key, hash(key), operator.itemgetter(i)))
    return _GETITEMS


def getitem(node: Node, i: int) -> Node:
    """Output ``i`` of a multi-output node."""
    key, kh, fn = _getitem_table(i + 1)[i]
    return make_node(GETITEM, key, kh, (node,), fn)


def getitems(node: Node, indices: Iterable[int]) -> list[Node]:
    """``[getitem(node, i) for i in indices]``, inlined: a foreach optimizer op writes ~150
    outputs, each one getitem node (a third of a GPT step's recorded nodes)."""
    indices = list(indices)
    if not STATE.consing or not indices:
        return [getitem(node, i) for i in indices]
    table = _getitem_table(max(indices) + 1)
    out: list[Node] = []
    nid, nh, inputs = id(node), node.hash, (node,)
    t, base = _TAPE, _BASE
    if len(_CONS) + len(indices) >= CONS_LIMIT:
        _CONS.clear()
    hits = 0
    if t and t[-1] is node:  # recorded just now: none of its outputs has a node yet
        first = base + len(t)
        for k, i in enumerate(indices):
            key, kh, fn = table[i]
            g = Node(GETITEM, key, inputs, hash((kh, nh)), fn)
            g.tix = first + k
            _CONS[(kh, nid)] = g
            out.append(g)
        t.extend(out)
    else:
        for i in indices:
            key, kh, fn = table[i]
            ck = (kh, nid)
            g = _CONS.get(ck)
            if g is not None and g.key == key:
                hits += 1
            else:
                g = _CONS[ck] = Node(GETITEM, key, inputs, hash((kh, nh)), fn)
                if t is not None:
                    g.tix = base + len(t)
                    t.append(g)
            out.append(g)
    if t is not None and len(t) > TAPE_LIMIT:
        _drop_tape()
    counts = metrics._COUNTS
    counts["hash_cons_hits"] += hits
    counts["ops_recorded"] += len(out) - hits
    return out


def topo_order(roots: list[Node]) -> list[Node]:
    """All nodes reachable from ``roots``, inputs before users (iterative DFS)."""
    entered: set[int] = set()
    order: list[Node] = []
    for root in roots:
        if id(root) in entered:
            continue
        entered.add(id(root))
        stack: list[tuple[Node, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            inputs = node.inputs
            while i < len(inputs) and id(inputs[i]) in entered:
                i += 1
            if i < len(inputs):
                stack.append((node, i + 1))
                entered.add(id(inputs[i]))
                stack.append((inputs[i], 0))
            else:
                order.append(node)
    return order


# The same node type and functions in C (core.native), chosen once at import.
from xla_dtensor.core import native as _native  # noqa: E402

# The Python path's type and functions, kept for tests comparing the two paths.
PYTHON = {"Node": Node, "make_node": make_node, "param_leaf": param_leaf, "getitems": getitems}

if _native.ON:
    _c = _native.MODULE
    _c.configure_ir(globals(), STATE, metrics._COUNTS)
    Node = _c.Node  # type: ignore[misc]  # noqa: F811
    make_node = _c.make_node  # noqa: F811
    param_leaf = _c.param_leaf  # noqa: F811
    _c_getitems = _c.getitems

    def getitems(node: Node, indices: Iterable[int]) -> list[Node]:  # noqa: F811
        """``[getitem(node, i) for i in indices]`` (in C: see the Python version above)."""
        indices = list(indices)
        return _c_getitems(node, indices, _getitem_table(max(indices) + 1) if indices else _GETITEMS, GETITEM)
