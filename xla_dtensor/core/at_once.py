"""Eager mode's execution: the op just recorded is computed at once, through a one-op program cache.

:func:`.dispatch.dispatch` calls :func:`compute_now` after recording an op while the lock holder's
mode is eager (``STATE.consing`` off: see :mod:`.state`). The executables are cached by
graph structure like any lazy program, so a repeated op with the same shapes compiles
once; a cache hit is found by a cheap key (:func:`_flat_key`) and called directly. An
in-place op donates the buffer it overwrites when nothing else holds it
(:func:`_donatable`), so it reuses that memory as torch's in-place ops do.
"""
from __future__ import annotations

import sys
import time
from typing import Any

from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core import executor
from xla_dtensor.core.ir import DATA, GETITEM, Node, data_leaf
from xla_dtensor.core.signature import op_info
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.debug import metrics_report as timing

metrics._COUNTS.setdefault("eager_ops", 0)
metrics._COUNTS.setdefault("eager_donated", 0)  # buffers eager in-place ops reused (see _donatable)


def release() -> None:
    """Forget the one-op executables (``executor.release_executables`` calls it)."""
    _FLAT.clear()


def _collect(x: Any, out: dict) -> None:
    if isinstance(x, LazyTensor):
        s = x._storage
        if s.value.fn is not None:
            out[id(s)] = s
    elif isinstance(x, (list, tuple)):
        for v in x:
            _collect(v, out)


_FLAT: dict[tuple, Any] = {}  # one-op program key -> executable (see _flat_key); at most config.cache_size


def _flat_key(roots: list[Any]) -> tuple[tuple, list[Any]] | None:
    """(a cheap exact key, the leaves) when ``roots`` are one node (or its outputs) over
    leaves and small graphs of leaves, else None.

    Such a program's plan is fixed by the node's structural hash (which covers its
    inputs' metadata and shardings), the outputs taken, the shardings and the wiring: a
    direct input is a leaf, or a small graph over leaves (a view of a materialized tensor:
    ``mm(x, t(w))``; :func:`_nested_key`). The leaves come in the order
    :func:`executor.make_plan`'s walk finds them, each once. Eager ops on materialized
    tensors or views of them, and the foreach and fused optimizer ops (one node over
    ~40-150 parameters, state tensors and view gradients) take this path; only graphs of
    more than ``_NESTED_LIMIT`` nodes are planned.
    NOTE: like the executor's own cache key (a tuple of node hashes), this trusts 64-bit
    structural hashes not to collide.
    """
    r0 = roots[0]
    if r0.op == GETITEM:
        node = r0.inputs[0]
        idx = []
        for r in roots:
            if r.op != GETITEM or r.inputs[0] is not node or r.sharding is not None:
                return None
            idx.append(r.key[1])
        taken: tuple | None = tuple(idx)
    elif len(roots) == 1:
        node, taken = r0, None
    else:
        return None
    inputs = node.inputs
    for x in inputs:
        if x.fn is not None:
            return _nested_key(node, taken)
    if len({id(x) for x in inputs}) == len(inputs):
        return (node.hash, taken, node.sharding, len(inputs)), list(inputs)  # (a list: see _donatable)
    return _nested_key(node, taken)  # a leaf used twice (``addcmul(v, g, g)``): the wiring spelled out


_NESTED_LIMIT = 256  # nodes walked for a key (bounds the recursion: two frames a level); bigger graphs are planned


def _nested_key(node: Any, taken: tuple | None) -> tuple[tuple, list] | None:
    """:func:`_flat_key` with the wiring spelled out: each input a leaf index (each leaf passed
    once) or an inner node (a view of a materialized tensor, ``t(view(x))``) by its hash,
    sharding and wiring."""
    seen: dict[int, Any] = {}  # id -> leaf index, or the inner node's entry
    leaves: list[Any] = []
    try:
        wiring = tuple([_walk(x, seen, leaves) for x in node.inputs])
    except (_TooBig, RecursionError):  # a deep chain on an already deep stack: planned (iteratively)
        return None
    return (node.hash, taken, node.sharding, wiring), leaves


def _walk(x: Any, seen: dict[int, Any], leaves: list[Any]) -> Any:
    """:func:`_nested_key`'s entry for ``x``.

    NOTE: a module function, not a closure: a recursive closure is a reference cycle that
    keeps ``leaves`` (and the leaves' buffers) alive until the cycle collector runs.
    """
    w = seen.get(id(x))
    if w is not None:
        return w
    if x.fn is None:
        w = len(leaves)
        leaves.append(x)
    elif len(seen) >= _NESTED_LIMIT:
        raise _TooBig
    else:
        w = ("n", x.hash, x.sharding, tuple([_walk(y, seen, leaves) for y in x.inputs]))
    seen[id(x)] = w
    return w


class _TooBig(Exception):
    """The graph under an eager op is too big for :func:`_nested_key`."""


def _run(roots: list[Any], partners: list[int | None]) -> list[Any]:
    """Compute ``roots`` now: the cached one-op program's executable, called directly.

    ``partners``: per root, the id of the leaf its storage held before this op wrote it
    (``Storage.donor``), or None. Such a leaf that nothing else references is donated
    (:func:`_donatable`): an in-place op reuses its buffer, as torch's does.
    NOTE: the same plan and cache key as ``executor.execute``, without its debug wrapper
    on a cache hit; a miss, or debugging on, takes the full path, which compiles and
    explains (debugging on donates nothing).
    """
    if STATE.debugging:
        return executor.execute(roots)
    flat = _flat_key(roots)
    if flat is None:
        return executor.execute(roots)
    key, leaves = flat
    donate = _donatable(leaves, partners)
    if donate:
        key = (*key, donate)
    hit = _FLAT.get(key)
    if hit is not None:
        compiled, order = hit
        metrics._COUNTS["cache_hits"] += 1
        metrics._COUNTS["executions"] += 1
        metrics._COUNTS["eager_donated"] += len(donate)
        args = [n.data for n in leaves]
        return compiled(*(args if order is None else [args[i] for i in order]))
    ids = {id(leaves[i]) for i in donate}
    plan, order, _, ekey = executor.layout(roots, ids, partners)
    compiled = executor.lookup(ekey)
    if compiled is None:
        out = executor.execute(roots, ids, partners)
        compiled = executor.cached(ekey)
    else:
        out = compiled(*executor.arguments(plan, order))
        metrics._COUNTS["executions"] += 1
    metrics._COUNTS["eager_donated"] += len(donate)
    if compiled is not None and [id(n) for n in plan.leaves] == [id(n) for n in leaves]:
        if len(_FLAT) >= config.cache_size:
            _FLAT.clear()
        _FLAT[key] = (compiled, order)
    return out


def _refs(leaves: list[Any], i: int) -> tuple[int, int]:
    """Reference counts of leaf ``leaves[i]`` and of its array (see :func:`_donatable`)."""
    n = leaves[i]
    return sys.getrefcount(n), sys.getrefcount(n.data)


def _sole_refs() -> tuple[int, int]:
    """:func:`_refs` of a leaf referenced by one graph node and a leaves list, whose array only
    it references: measured, so the baseline follows the interpreter's own counting."""
    leaves = [Node(DATA, (DATA, (1,), None, None), (), 0, None, object())]
    user = Node("user", None, (leaves[0],), 0, len)  # noqa: F841  (the one graph node reading it)
    return _refs(leaves, 0)


_SOLE = _sole_refs()


def _donatable(leaves: list[Any], partners: list[int | None]) -> tuple[int, ...]:
    """Positions in ``leaves`` of the overwritten values whose buffers this op may reuse.

    A leaf qualifies when it is the value a storage held before this op wrote it
    (``partners``), is not a 0-d scalar (:func:`executor.donatable`), and is referenced only
    by this op's graph (one node) and ``leaves``, and its array only by it. So a leaf still
    held by another storage (a tensor that shares it: ``spmd`` re-wraps, a compiled replay's
    shared step counters), by a view's cached value, or an array held anywhere else, is
    never donated. The pending graph that reads it is dropped once the op has run.
    """
    if not config.donate:
        return ()
    olds = {p for p in partners if p is not None}
    if not olds:
        return ()
    # NOTE: by index: a loop variable holding the leaf would count as a reference
    return tuple([i for i in range(len(leaves))
                  if id(leaves[i]) in olds and executor.donatable(leaves[i]) and _refs(leaves, i) == _SOLE])


def compute_now(op: Any, args: tuple, kwargs: dict, res: Any) -> Any:
    """Compute what op ``op`` (recorded, result ``res``) made pending: its outputs and the tensors it wrote."""
    t0 = time.perf_counter()
    todo: dict[int, Any] = {}
    _collect(res, todo)
    for pos, name in op_info(op).mutated:
        _collect(args[pos] if pos is not None and pos < len(args) else kwargs.get(name), todo)
    if todo:
        storages = list(todo.values())
        if len(storages) > 1:
            storages.sort(key=_seq)
        arrays = _run([s.value for s in storages], [s.donor for s in storages])
        for s, arr in zip(storages, arrays):
            s.value = data_leaf(arr, s.meta[0], s.meta[1])
            s.version += 1
            s.donor = None
    metrics._COUNTS["eager_ops"] += 1
    timing.record("eager_op", time.perf_counter() - t0)
    return res


def _seq(s: Any) -> int:
    return s.seq
