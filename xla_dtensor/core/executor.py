"""Barriers: lower pending IR to one JAX function, compile (cached), run, rebind.

``sync()`` materializes every live storage with a pending value in one program (those
of the calling thread when several threads use the device: :mod:`.threads`);
``to_cpu`` / ``item`` materialize only the value they need. Programs are keyed by
their structure (node hashes and wiring, leaf metadata, shardings, donation), so the
same step maps to the same executable whatever the data.
"""
from __future__ import annotations

import collections
import functools
import itertools
import operator
import time
import warnings
from typing import Any, Callable, Iterable

import jax
import numpy as np
import torch

from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core import index_checks, native, packs, plan_cache, reaper, state, threads
from xla_dtensor.core.dtypes import to_jax
from xla_dtensor.core.ir import DATA, Node, clear_cons, data_leaf, partial_barrier, tape
from xla_dtensor.core.peer_errors import guard
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, Storage, live, value_of
from xla_dtensor.core.tensor import pending as tensor_pending

_CACHE: collections.OrderedDict[Any, Any] = collections.OrderedDict()
# NOTE: hooks for xla_dtensor.spmd (sticky shardings, uneven padding); empty unless it is imported.
PRE_SYNC: list[Callable[[list[Storage]], None]] = []  # may rewrite pending storages' values
POST_SYNC: list[Callable[[list[Storage]], None]] = []  # after the storages are rebound
KEEP_PENDING: list[Callable[[Storage], bool]] = []  # materialize() leaves such a storage's value pending
ON_EXECUTE: list[Callable[[list[Node], bool, float], None]] = []  # after each execute: (roots, compiled, seconds)
# NOTE: while sync() runs PRE_SYNC (inside state.deferring()), a hook may queue node constraints to lay on
# the graph's walk instead of walking it itself (state.defer): objects with
# ``constrain(plan, skip, limit) -> Plan``, ``skip`` a function giving a set of node ids (see _deferred).
# While xla_dtensor.compile records a function (STATE.capturing), work on device data must become graph
# nodes (a layout change done at once would be baked into the program as a constant), and the capture's
# log gets, in order: ("read", value before, value after) per host read of a device value, ("host", leaf)
# per device leaf made from host data; jit.capture tells constant reads from data-dependent ones.
# dead inputs (e.g. a step's batch) are donated too; XLA just cannot reuse some of them
warnings.filterwarnings("ignore", message="Some donated buffers were not usable")


class Struct(tuple):
    """A plan's structure (a tuple) that hashes once: a GPT step's has ~4,000 entries, and the program
    cache, the activation tables and the replay checks each hashed it again (~0.5 ms a time)."""

    _hash: int | None = None

    def __hash__(self) -> int:
        h = self._hash
        if h is None:
            h = self._hash = tuple.__hash__(self)
        return h


def _lazy_list(slot: str, doc: str) -> property:
    """A :class:`Plan` list read from ``slot``, the plan's lists filled first if they are not yet."""
    def get(plan: Plan) -> list:
        if plan._fill is not None:
            plan._filled()
        return getattr(plan, slot)
    return property(get, doc=doc)


class Plan:
    """A pending graph laid out for lowering, from one topological walk of its roots.

    ``order``, ``fns``, ``wiring`` and ``shardings`` may be given as one function (``fill``) that
    returns them when first read: a repeated step's plan (``core.plan_cache``) whose program is
    cached runs without them.
    """

    __slots__ = ("struct", "leaves", "outs", "_order", "_fns", "_wiring", "_shardings", "_fill", "_at", "source")
    _FIELDS = ("struct", "order", "leaves", "fns", "wiring", "shardings", "outs")

    def __init__(self, struct: tuple, order: list[Node] | None, leaves: list[Node], fns: list | None,
                 wiring: list[tuple] | None, shardings: list[Any] | None, outs: list[int],
                 fill: Callable[[], tuple[list, list, list, list]] | None = None,
                 at: Callable[[int], Node] | None = None, source: Any = None) -> None:
        self.struct = struct  # node hashes, wiring and shardings: the program's cache identity
        self.leaves = leaves  # the program's arguments, in order
        self.outs = outs  # positions of the roots in ``order``
        self._order, self._fns, self._wiring, self._shardings = order, fns, wiring, shardings
        self._fill, self._at = fill, at  # at(i): order[i], without filling
        self.source = source  # what a repeated step's plan was laid out from (core.plan_cache), else None

    def _filled(self) -> None:
        self._order, self._fns, self._wiring, self._shardings = self._fill()  # type: ignore[misc]
        self._fill = self._at = None

    @property
    def filled(self) -> bool:
        """Whether the node lists exist (reading one fills them)."""
        return self._fill is None

    def node_at(self, i: int) -> Node:
        """``order[i]``, without filling the lists."""
        return self._order[i] if self._at is None else self._at(i)  # type: ignore[index]

    order = _lazy_list("_order", "Every node, inputs before users.")
    fns = _lazy_list("_fns", "Per node, its function (None: a leaf).")
    wiring = _lazy_list("_wiring", "Per node, the positions of its inputs in ``order``.")
    shardings = _lazy_list("_shardings", "Per node, the constraint to apply (None: none).")

    def _replace(self, **changes: Any) -> Plan:
        """A copy with ``changes`` (fields by name, as a NamedTuple's)."""
        unknown = set(changes) - set(self._FIELDS)
        if unknown:
            raise TypeError(f"Plan has no field(s) {sorted(unknown)}; fields: {self._FIELDS}")
        source = None if "leaves" in changes else self.source
        if self._fill is not None and not changes.keys() & {"order", "fns", "wiring", "shardings"}:
            return Plan(changes.get("struct", self.struct), None, changes.get("leaves", self.leaves), None, None, None,
                        changes.get("outs", self.outs), self._fill, self._at, source)  # still unfilled
        return Plan(*[changes[f] if f in changes else getattr(self, f) for f in self._FIELDS], source=source)


def make_plan(roots: list[Node]) -> Plan:
    """The pending graph under ``roots`` laid out for lowering (one walk; see :class:`Plan`)."""
    # NOTE: one iterative walk (ir.topo_order's DFS) that lays out each node as it is
    # finished; eager mode plans one small program per op, so this is on its hot path.
    pos: dict[int, int] = {}
    order: list[Node] = []
    struct: list[Any] = []
    leaves, fns, wiring, shardings = [], [], [], []
    for root in roots:
        if id(root) in pos:
            continue
        stack: list[tuple[Node, int]] = [(root, 0)]
        pos[id(root)] = -1  # entered, not finished
        while stack:
            node, i = stack.pop()
            inputs = node.inputs
            n_in = len(inputs)
            while i < n_in and id(inputs[i]) in pos:
                i += 1
            if i < n_in:
                stack.append((node, i + 1))
                pos[id(inputs[i])] = -1
                stack.append((inputs[i], 0))
                continue
            pos[id(node)] = len(order)
            order.append(node)
            if node.fn is None:
                leaves.append(node)
                struct.append(node.hash)
                fns.append(None)
                wiring.append(())
                shardings.append(None)
            else:
                w = tuple([pos[id(x)] for x in inputs])
                sh = node.sharding
                struct.append((node.hash, w) if sh is None else (node.hash, w, sh))
                fns.append(node.fn)
                wiring.append(w)
                shardings.append(sh)
    outs = [pos[id(r)] for r in roots]
    return Plan(Struct(struct), order, leaves, fns, wiring, shardings, outs)


def lower(plan: Plan, donate_idx: tuple[int, ...] = (), order: list[int] | None = None,
          out_shardings: tuple | None = None, packed_in: packs.Inputs | None = None,
          packed_out: packs.Outputs | None = None) -> Any:
    """``plan`` as one jitted JAX function, lowered for its leaves' arrays (``jax.stages.Lowered``).

    ``order``: the leaves' positions in argument order (None: ``plan.leaves`` order);
    ``donate_idx`` counts in argument order; ``out_shardings``: per output, its sharding (None: as
    XLA propagates); ``packed_in``: the arguments with packed members' packs (:mod:`.packs`);
    ``packed_out``: the roots that leave as packs.
    """
    program = make_program(plan.fns, plan.wiring, plan.shardings, plan.outs)
    if order is not None:
        program = _permuted(program, order)
    if packed_in is not None or packed_out is not None:
        program = packs.program(program, packed_in, packed_out)
    with warnings.catch_warnings():
        # NOTE: every leaf buffer no live tensor holds is donated, not only those an output can take over:
        # a backward launched on its own (core.phases) reads activations autograd has freed; XLA reuses
        # what it can and jax frees the rest, which it warns about
        warnings.filterwarnings("ignore", message="Some donated buffers were not usable")
        given = {} if out_shardings is None else {"out_shardings": out_shardings}
        args = arguments(plan, order) if packed_in is None else packed_in.args
        return jax.jit(program, donate_argnums=donate_idx, **given).lower(*args)


def arg_order(n_leaves: int, donated: set[int], partners: Iterable[int | None]) -> list[int]:
    """Leaf positions in argument order: kept leaves, then donated ones in their outputs' order.

    ``partners[k]``: the position of the leaf whose buffer output ``k`` overwrites (its
    storage's value before the write), or None / -1.
    NOTE: ``jax.jit`` aliases each output to the first unused donated argument of the same
    shape and dtype. In graph order, parameter A's buffer went to parameter B's update
    and XLA copied nearly every state tensor in and out (133 copies in a 2-layer GPT-2
    step); with each output's own buffer first in line, only what XLA needs is copied.
    """
    paired = list(dict.fromkeys(p for p in partners if p in donated))
    seen = set(paired)
    kept = [i for i in range(n_leaves) if i not in donated]
    return kept + paired + [i for i in sorted(donated) if i not in seen]


_RAW = operator.attrgetter("raw")


def arguments(plan: Plan, order: list[int] | None) -> list[Any]:
    """The arrays of ``plan``'s leaves in argument order (``order``; None: plan order), packed members unpacked."""
    leaves = plan.leaves
    return [n.data for n in leaves] if order is None else [leaves[i].data for i in order]


def _permuted(run: Callable[..., Any], order: list[int]) -> Callable[..., Any]:
    """``run`` (which takes the leaves in plan order) taking them in ``order``."""
    n = len(order)

    def program(*args: Any) -> tuple:
        values: list[Any] = [None] * n
        for j, i in enumerate(order):
            values[i] = args[j]
        return run(*values)
    return program


def lookup(key: Any) -> Any:
    """The cached executable for ``key`` (counted as a cache hit), or ``None``."""
    compiled = _CACHE.get(key)
    if compiled is not None:
        metrics._COUNTS["cache_hits"] += 1
        _CACHE.move_to_end(key)
    return compiled


def cached(key: Any) -> Any:
    """The cached executable for ``key`` or ``None``, without counting a hit or touching the LRU order."""
    return _CACHE.get(key)


def store(key: Any, compiled: Any) -> None:
    """Cache a freshly compiled executable (counted as a compile); evict beyond ``config.cache_size``."""
    metrics._COUNTS["compiles"] += 1
    _CACHE[key] = compiled
    while len(_CACHE) > config.cache_size:
        _, evicted = _CACHE.popitem(last=False)
        _SCALAR_SLOTS.pop(id(evicted), None)  # its scalar slots would keep the executable (and its memory maps) alive
        _OUT_KEYS.pop(id(evicted), None)


def release_executables() -> int:
    """Drop every cached executable of the lazy core and JAX's own caches; returns how many were cached.

    Each XLA:CPU executable holds about 6 memory maps of JIT code; a process that compiles
    thousands of different programs (a test session) reaches the kernel's
    ``vm.max_map_count`` (65,530 by default), where XLA crashes in a compile. The next sync of
    a dropped program compiles it again.

    Example:
        >>> release_executables() >= 0
        True
    """
    n = len(_CACHE)
    _CACHE.clear()
    _SCALAR_SLOTS.clear()
    _OUT_KEYS.clear()
    global _RAN
    _RAN = None
    from xla_dtensor.core import at_once
    at_once.release()
    jax.clear_caches()
    return n


def last_executable() -> Any:
    """The executable the lazy core compiled or reused last (``jax.stages.Compiled``)."""
    if not _CACHE:
        raise LookupError("no program has been compiled yet")
    return next(reversed(_CACHE.values()))


def make_program(fns: list, wiring: list, shardings: list, outs: list[int]) -> Callable[..., Any]:
    """The traceable function computing a plan's ``outs`` from its leaves' values (in plan order)."""
    def run(*leaf_values: Any) -> tuple:
        env: list[Any] = [None] * len(fns)
        it = iter(leaf_values)
        for i, fn in enumerate(fns):
            if fn is None:
                env[i] = next(it)
            else:
                v = fn(*[env[j] for j in wiring[i]])
                if shardings[i] is not None:
                    v = jax.lax.with_sharding_constraint(v, shardings[i])
                env[i] = v
        return tuple(env[j] for j in outs)
    return run


def _leaf_value(n: Node) -> Any:
    return n.data


def donatable(leaf: Node) -> bool:
    """Whether a device-data leaf's buffer is worth donating: everything but 0-d scalars.

    NOTE: XLA may fuse a scalar's update into several consumers (torch's AdamW computes
    ``beta1 ** (step + 1)`` per parameter), which then read the old value after the new
    one is written; a donated scalar must then be copied first. Donating the 36 step
    counters of the benchmark GPT-2 cost 36 copy kernels per step and saved 144 bytes.
    """
    return leaf.key[1] != ()


def layout(roots: list[Node], donate: set[int] | None = None, partners: list[int | None] | None = None,
           plan: Plan | None = None, donated: list[int] | None = None
           ) -> tuple[Plan, list[int] | tuple[int, ...] | None, tuple[int, ...], tuple]:
    """``roots``' plan, argument order (None: plan order), donated argument positions and
    executable cache key; the arguments are ``arguments(plan, order)``.

    ``donate``, ``partners``, ``plan`` and ``donated`` as in :func:`execute`.
    """
    plan = make_plan(roots) if plan is None else plan
    if not config.donate:
        donated = []
    elif donated is None:
        donated = [i for i, n in enumerate(plan.leaves) if id(n) in donate and donatable(n)] if donate else []
    if not donated:
        return plan, None, (), (plan.struct, tuple(plan.outs), (), None)
    at = dict(zip(map(id, plan.leaves), itertools.count()))
    paired = tuple(map(at.get, partners or ()))
    memo = (plan.struct, tuple(plan.outs), tuple(donated), paired)
    hit = _ORDERS.get(memo)
    if hit is None:  # NOTE: a repeated step donates the same positions to the same outputs (~0.3 ms a GPT step)
        order = tuple(arg_order(len(plan.leaves), set(donated), paired))
        donate_idx = tuple(range(len(order) - len(donated), len(order)))
        if len(_ORDERS) >= 4 * config.cache_size:
            _ORDERS.clear()
        hit = _ORDERS[memo] = (order, donate_idx, (plan.struct, memo[1], donate_idx, order))
    return plan, hit[0], hit[1], hit[2]


# (plan structure, outputs, donated leaf positions, partner positions) -> (argument order, donated
# arguments, executable key)
_ORDERS: dict[tuple, tuple] = {}


@guard
def execute(roots: list[Node], donate: set[int] | None = None, partners: list[int | None] | None = None,
            plan: Plan | None = None, donated: list[int] | None = None, out_shardings: tuple | None = None,
            packed_out: packs.Outputs | None = None) -> list[Any]:
    """Compute ``roots``; returns their arrays.

    ``donate``: ids of leaves whose buffers may be reused; ``partners``: per root, the
    id of the leaf it overwrites (see :func:`arg_order`); ``plan``: ``make_plan(roots)`` if the
    caller has it; ``donated``: instead of ``donate``, the positions in ``plan.leaves`` of the
    donatable leaves (ascending); ``out_shardings``: per output, the sharding to compute it in
    (None: as XLA propagates). ``packed_out``: the roots that leave as packs (then the arrays are
    the other roots', the packs', then the rest).
    """
    t0 = time.perf_counter()
    plan, order, donate_idx, key = layout(roots, donate, partners, plan, donated)
    leaves = plan.leaves if order is None else list(map(plan.leaves.__getitem__, order))
    packed_in = packs.split(leaves)
    if packed_in is None:
        raws = list(map(_RAW, leaves))
    else:
        donate_idx = packed_in.donated(donate_idx)
        raws = packed_in.args
        key = (key, packed_in.sig, donate_idx)
    if packed_out is not None:
        key = (key, packed_out.sig)
    if out_shardings is not None:
        key = (key, out_shardings)  # NOTE: a NamedSharding caches its hash: ~15 us for a GPT step's 590
    compiled = lookup(key)
    fresh = compiled is None
    if fresh:
        compiled = lower(plan, donate_idx, order, out_shardings, packed_in, packed_out).compile()
        store(key, compiled)
    result = compiled(*placed_scalars(compiled, key, raws))
    global _RAN
    _RAN = compiled
    metrics._COUNTS["executions"] += 1
    for hook in ON_EXECUTE:
        hook(roots, fresh, time.perf_counter() - t0)
    return list(result)


_SCALAR_SLOTS: dict[int, list[Any]] = {}  # id(compiled) -> [compiled, slots, shardings, last values, arrays]
_SCALAR_ARRAYS: dict[tuple, Any] = {}
_SCALAR_TYPES = (int, float, complex)


def placed_scalars(compiled: Any, key: Any, args: list[Any]) -> list[Any]:
    """``args`` with each Python scalar (a ``PARAM`` leaf's value) replaced by a device array of it
    in the layout ``compiled`` expects, made once per (value, layout) and reused.

    NOTE: ``compiled`` otherwise transfers every Python scalar argument to its devices on every
    call, once per device: ~0.6 ms per scalar on 8 CPU devices, and a GPT-2 SGD step passes ~20
    (learning rates, norms' epsilons, dropout-free scales). The arrays are weakly typed
    (``jnp.asarray`` of a Python scalar), as the traced program's scalar inputs are.
    The slots are found by the executable's identity (hashing ``key``, the whole graph's
    structure, again cost ~0.5 ms a GPT step), and the last call's values and arrays are
    kept, so a step whose scalars did not change hashes no sharding (``key`` is unused).
    """
    entry = _SCALAR_SLOTS.get(id(compiled))
    if entry is None or entry[0] is not compiled:
        if len(_SCALAR_SLOTS) > 2 * config.cache_size:
            _SCALAR_SLOTS.clear()
        shardings = compiled.input_shardings[0]
        idx = [j for j, a in enumerate(args) if type(a) in _SCALAR_TYPES]
        one: dict[Any, Any] = {}  # equal shardings as one object: _scalar_array finds arrays by its identity
        entry = _SCALAR_SLOTS[id(compiled)] = [compiled, idx, [one.setdefault(shardings[j], shardings[j]) for j in idx],
                                               None, None]
    _, idx, shardings, last, arrays = entry
    values = [args[j] for j in idx]
    # NOTE: the key of ``compiled`` fixes each slot's Python type, so == is enough (a NaN never matches)
    if values != last:
        if last is None:
            arrays = [_scalar_array(v, sh) for v, sh in zip(values, shardings)]
        else:  # only the slots that changed (AdamW's bias corrections, not its betas and rates)
            arrays = [a if v == w else _scalar_array(v, sh) for v, w, a, sh in zip(values, last, arrays, shardings)]
        entry[3], entry[4] = values, arrays
    for j, arr in zip(idx, arrays):
        args[j] = arr
    return args


def _scalar_array(v: Any, sharding: Any) -> Any:
    # NOTE: keyed by the sharding's id (hashing a NamedSharding runs Python); the entry keeps it alive
    k = (type(v), v, id(sharding))
    hit = _SCALAR_ARRAYS.get(k)
    if hit is None or hit[0] is not sharding:
        if len(_SCALAR_ARRAYS) > 4096:  # a schedule makes new values every step: keep recent ones only
            _SCALAR_ARRAYS.clear()
        hit = _SCALAR_ARRAYS[k] = (sharding, jax.device_put(jax.numpy.asarray(v), sharding))
    return hit[1]


def _deferred(plan: Plan, pending: list[Storage], before: list[Node]) -> Plan:
    """``plan`` with the deferred constraints (``STATE.deferred``) laid on it. Each sees the graph as the hooks found it:
    ``skip()``, the ids of the nodes a hook wrapped around a storage's value (a chain of one-input
    nodes down to the value before the hooks, e.g. a sticky layout's constraint), computed when
    first asked (a table asks once per graph structure), and ``limit``, the end of the pending
    values' part of ``plan.order`` (index checks' roots come after)."""
    tables, STATE.deferred = STATE.deferred, []
    skip = functools.cache(lambda: _wrapped(pending, before))
    limit = max(plan.outs[:len(pending)]) + 1
    for t in tables:
        plan = t.constrain(plan, skip, limit)
    return plan


def _wrapped(pending: list[Storage], before: list[Node]) -> set[int]:
    """The ids of the nodes the sync hooks wrapped around ``pending``'s values (``before``: the values they found)."""
    skip: set[int] = set()
    for s, old in zip(pending, before):
        chain, n = [], s.value
        while n is not old and len(n.inputs) == 1 and len(chain) < 4:
            chain.append(id(n))
            n = n.inputs[0]
        if n is old:
            skip.update(chain)
    return skip


def sync(wait: bool = False, *, pre_hooks: bool = True, all_threads: bool = False, pack: bool = True) -> None:
    """Execute every live pending tensor in one program and rebind them to the results.

    With several threads on the device, only the calling thread's pending tensors (and
    those of finished threads); ``all_threads=True``: every thread's.
    ``pre_hooks=False``: skip the ``PRE_SYNC`` hooks (the caller ran them on every pending
    storage already: ``xla_dtensor.compile`` after recording a call). ``pack=False``: each value its own
    array (:mod:`.packs`; ``compile``'s lazy calls run their traced call's programs).

    Example:
        >>> import torch, xla_dtensor
        >>> x = torch.ones(2, device=xla_dtensor.device()) * 3
        >>> xla_dtensor.sync()
    """
    with threads.held():
        arrays, checks, checked, me = _sync(pre_hooks, all_threads, pack)
    if wait:
        _await(arrays)
        reaper.drain()
    if index_checks.LAUNCHED:
        index_checks.verify_launched(me)  # programs launched before this one: waiting on them keeps ours queued
    if wait:
        index_checks.verify(checks, checked)
    else:
        index_checks.launched(checks, checked, me)


def _sync(pre_hooks: bool, all_threads: bool, pack: bool = True) -> tuple[list[Any], list, list[Any], int | None]:
    """:func:`sync` under the lock: (the pending storages' arrays, the index checks run, their
    arrays, the thread whose index checks they are: ``None`` while one thread uses the device).

    NOTE: ``all_threads`` computes every thread's pending values but only the caller's index
    checks: another thread's stay pending (their leaves are not donated), so each thread's
    out-of-range index is raised in that thread, also when ``compile`` syncs every thread.
    """
    owner = threads.me() if STATE.multi else None
    pending, clean = tensor_pending()  # (in C: a GPT step holds ~800 storages)
    kept: set[int] = set(map(id, clean))
    pending, others = threads.split(pending, _owner, None if all_threads else owner)
    foreign: list[Node] = [s.value for s in others]  # other threads' pending values: their leaves are not donated
    checks, check_roots = index_checks.take(owner) if index_checks.PENDING else ([], [])
    if not pending and not checks:
        return [], [], [], owner
    before = list(map(_VALUE, pending))
    with state.deferring() as deferred:
        for hook in PRE_SYNC if pre_hooks else ():
            hook(pending)
    values, where, firsts, donors, metas = _distinct_values(pending)
    held = _held(pending, where, len(values)) if STATE.held is not None else None
    if held is not None and held[1]:  # storages sharing a value asked for different layouts: constraint nodes
        values, where, firsts, donors, metas = _distinct_values(pending)
        held = _held(pending, where, len(values))
    roots = values + check_roots
    # NOTE: one walk of the graph (none when the step repeats), shared with execute (a second one cost ~10% of a sync)
    plan = plan_cache.plan(roots, make_plan)
    if deferred:
        plan = _deferred(plan, pending, before)
    if foreign or index_checks.PENDING:
        kept |= threads.reached_leaves(foreign + [c.node for c in index_checks.PENDING])
    n = len(values)
    one = packs.one_device(plan.struct, plan.leaves)  # its SingleDeviceSharding, or None: several devices
    packed = _packing(plan, metas, held, pre_hooks and pack, donors, one)
    if packed is None:
        outsh = None if held is None else held[0] + (None,) * len(check_roots)
    else:
        outsh = packed.shardings(None if held is None else held[0], len(check_roots))
    arrays = execute(roots, None, donors + [None] * len(check_roots), plan, _donated(plan, kept), outsh,
                     packed)
    clear_cons()  # the graph it indexes is computed; the next step starts a fresh table
    if packed is None:
        leaves = out_leaves(arrays[:n], metas)
        done, checked = arrays[:n], arrays[n:]
    else:
        k, g = len(packed.kept), len(packed.groups)
        leaves = packed.leaves(out_leaves(arrays[:k], [metas[i] for i in packed.kept]), arrays[k:k + g], _data_leaves)
        done, checked = arrays[:k + g], arrays[k + g:]
    _rebind(pending, where, leaves)  # storages that held one value share its leaf; the leaves taped
    for hook in POST_SYNC:
        hook(pending)
    if config.donate and one is None:
        # NOTE: a program on several devices: the step's old graph, and the arrays it read, freed beside the next
        # step's recording (core.reaper); the names below were its last references here. On one device the free
        # is short (its state is a few packs) and a helper thread's wake-ups cost the next step more. Without
        # donation the old arrays still hold their memory: freed here, at once
        garbage = [before, values, roots, plan]
        del before, values, roots, plan
        reaper.drop(garbage)
    return done, checks, checked, owner


def _packing(plan: Plan, metas: list[tuple], held: tuple | None, pack: bool,
             donors: list[int | None], one: Any) -> packs.Outputs | None:
    """Which of a sync's values leave its program packed (:mod:`.packs`), or None: none (packing is off,
    the caller asked for none, or ``compile`` records). ``donors``: per value, the id of the leaf it overwrites;
    ``one``: the device the whole program runs on (:func:`.packs.one_device`), or None."""
    if not config.pack_state or not pack or STATE.capturing:
        return None
    def fed() -> list[bool]:
        operands = packs.matrix_operands(plan.order)
        return [d in operands for d in donors]
    return packs.outputs(plan.struct, plan.outs, metas, None if held is None else held[0], one, fed)


_RAN: Any = None  # the executable execute() ran last (under the lock)
# id(executable) -> (the executable, its outputs' metadata, their leaf keys and hashes, the first output's layout)
_OUT_KEYS: dict[int, tuple] = {}


def out_leaves(arrays: list[Any], metas: list[tuple]) -> list[Node]:
    """Device-data leaves of output ``arrays`` (of metadata ``metas``) of the executable :func:`execute` ran last.

    NOTE: an executable hands back arrays of the same layouts (its output shardings, the same
    objects) every call: the leaf keys of its outputs are made once, not per output and call
    (reading a jax array's sharding and finding its key cost ~0.5 ms a GPT step).
    """
    compiled = _RAN
    hit = _OUT_KEYS.get(id(compiled))
    if hit is None or hit[0] is not compiled or hit[1] != metas or not arrays \
            or getattr(arrays[0], "sharding", None) is not hit[3]:
        leaves = [data_leaf(a, m[0], m[1]) for a, m in zip(arrays, metas)]
        if compiled is not None and arrays:
            if len(_OUT_KEYS) > 2 * config.cache_size:
                _OUT_KEYS.clear()
            _OUT_KEYS[id(compiled)] = (compiled, metas, [(x.key, x.hash) for x in leaves],
                                       getattr(arrays[0], "sharding", None))
        return leaves
    return _data_leaves(hit[2], arrays, DATA)


def _rebind_py(pending: list[Storage], where: list[int] | None, leaves: list[Node]) -> None:
    """Each pending storage's value its new leaf (``leaves[where[i]]``, or ``leaves[i]`` when ``where`` is
    None), its version one more; the leaves on the tape (the next step reads them: plan_cache numbers its
    leaves by the tape)."""
    if where is None:
        for s, leaf in zip(pending, leaves):
            s.value = leaf
            s.version += 1
    else:
        for s, k in zip(pending, where):
            s.value = leaves[k]
            s.version += 1
    tape(leaves)


def _data_leaves_py(keys: list[tuple], arrays: list[Any], op: str) -> list[Node]:
    return [Node(op, k, (), h, None, a) for (k, h), a in zip(keys, arrays)]


# NOTE: in C with the C recorder (core.native): ~0.2 ms of a 12-layer GPT step's sync, ~600 outputs
_rebind, _data_leaves = (native.MODULE.rebind, native.MODULE.data_leaves) if native.ON else (_rebind_py,
                                                                                            _data_leaves_py)


def _distinct_values_py(pending: list[Storage]) -> tuple[list[Node], list[int] | None, list[Storage], list, list]:
    """(the ``pending`` storages' values without repeats; per storage its value's position there, ``None`` when
    none repeats; per value the first storage holding it (its donor pairs the output: :func:`arg_order`), their
    donors and their metas).

    NOTE: storages whose pending values are one node (equal optimizer step counters, a tensor
    copied into another) get one program output and share its leaf.
    """
    values = list(map(_VALUE, pending))
    ids = list(map(id, values))
    distinct = list(dict.fromkeys(ids))
    if len(distinct) == len(ids):
        where, firsts = None, pending
    else:
        index, by_id = dict(zip(distinct, itertools.count())), dict(zip(ids, values))
        values, where = list(map(by_id.__getitem__, distinct)), list(map(index.__getitem__, ids))
        firsts = [None] * len(values)
        for s, k in zip(pending, where):
            if firsts[k] is None:
                firsts[k] = s
    return values, where, firsts, list(map(_DONOR, firsts)), list(map(_META, firsts))


def _distinct_values(pending: list[Storage]) -> tuple[list[Node], list[int] | None, list[Storage], list, list]:
    """:func:`_distinct_values_py` in one C pass (core.native; ~0.6 ms less a GPT step's sync, ~600 values)."""
    got = NotImplemented if _DISTINCT_C is None else _DISTINCT_C(pending)
    return _distinct_values_py(pending) if got is NotImplemented else got


_DISTINCT_C = native.MODULE.distinct_values if native.ON else None


def _held(pending: list[Storage], where: list[int] | None, n: int) -> tuple[tuple, bool]:
    """(per distinct value, the output sharding the sync hooks asked for it (``STATE.held``, per pending
    storage); whether storages sharing a value asked for different ones).

    NOTE: those storages' values are then given constraint nodes to their own layouts (so they are
    distinct values) and dropped from the held list, and the caller finds the distinct values again.
    """
    held = STATE.held
    if where is None:
        return tuple(held), False
    out: list[Any] = [None] * n
    first = [True] * n
    clash: set[int] = set()
    for k, sh in zip(where, held):
        if first[k]:
            out[k], first[k] = sh, False
        elif sh is not out[k] and sh != out[k]:
            clash.add(k)
    if not clash:
        return tuple(out), False
    from xla_dtensor.core import layout as L
    for i, (s, k, sh) in enumerate(zip(pending, where, held)):
        if k in clash and sh is not None:
            s.value = L.constrain(s.value, sh)
            held[i] = None
    return (), True


_VALUE = operator.attrgetter("value")
_DONOR, _META = operator.attrgetter("donor"), operator.attrgetter("meta")


def _donated(plan: Plan, held: set[int]) -> list[int]:
    """Positions in ``plan.leaves`` of the leaves whose buffers may be donated: device arrays (not
    0-d: see :func:`donatable`) that no live storage holds.

    NOTE: which leaves are device arrays of rank > 0 follows from their hashes (kind, shape,
    layout), so a repeated step's plan (``plan.source``: its remembered layout) finds them once;
    a step then only leaves out the held ones (~0.3 ms a GPT step less).
    """
    leaves = plan.leaves
    src = plan.source
    cands = None if src is None else _CANDIDATES.get(id(src))
    if cands is None or cands[0] is not src:
        idx = [i for i, n in enumerate(leaves) if n.op == DATA and n.key[1] != () and isinstance(n.raw, jax.Array)]
        if src is None:
            return [i for i in idx if id(leaves[i]) not in held]
        if len(_CANDIDATES) >= 64:
            _CANDIDATES.clear()
        cands = _CANDIDATES[id(src)] = (src, idx)
    idx = cands[1]
    if not held:
        return list(idx)
    at = dict(zip(map(id, leaves), itertools.count()))
    out = {at[h] for h in held if h in at}
    return [i for i in idx if i not in out] if out else list(idx)


_CANDIDATES: dict[int, tuple] = {}  # id(a remembered plan layout) -> (it, its donatable leaf positions)


def _owner(s: Storage) -> int:
    return s.owner


def _await(arrays: list[Any]) -> None:
    """Wait for ``arrays`` (outside the lock); one another thread consumed meanwhile is not waited for."""
    for a in arrays:
        try:
            jax.block_until_ready(a)
        except RuntimeError:
            if not (isinstance(a, jax.Array) and a.is_deleted()):
                raise


def foreign_reads(arrays: list[Any]) -> bool:
    """Whether a pending value (of another thread) reads one of ``arrays``: a program that donates
    them must then wait for it (``compile``'s replay syncs every thread first)."""
    roots = [s.value for s in live() if s.value.fn is not None] + [c.node for c in index_checks.PENDING]
    if not roots:
        return False
    ids = {id(a) for a in arrays}
    from xla_dtensor.core.ir import topo_order
    return any(n.fn is None and id(packs.array_of(n)) in ids for n in topo_order(roots))


mark_step = sync


@guard
def wait() -> None:
    """Block until every computation launched so far has finished."""
    with threads.held():
        arrays = [a for a in (packs.array_of(s.value) for s in live() if s.value.fn is None) if isinstance(a, jax.Array)]
    _await(arrays)
    reaper.drain()
    index_checks.verify_launched(threads.me() if STATE.multi else None)


def materialize(t: LazyTensor) -> Any:
    """The array of ``t``'s current value, computing only what it needs (and pending index checks)."""
    with threads.held():
        arr, checks, checked, me = _materialize(t)
    if index_checks.LAUNCHED:
        index_checks.verify_launched(me)
    index_checks.verify(checks, checked)
    return arr


def _materialize(t: LazyTensor) -> tuple[Any, list, list[Any], int | None]:
    """:func:`materialize` under the lock: (the array, the index checks run, their arrays, the thread)."""
    me = threads.me() if STATE.multi else None
    checks, check_roots = index_checks.take(me) if index_checks.PENDING else ([], [])
    v = value_of(t)
    if v.fn is None:
        return v.data, checks, (execute(check_roots) if checks else []), me
    arr, *checked = execute([v] + check_roots)
    del v, check_roots  # NOTE: before the barrier, which keeps on the tape what something still holds
    if not t._chain and not any(keep(t._storage) for keep in KEEP_PENDING):
        # NOTE: a view keeps its pending value: a cached leaf could be donated later
        t._storage.value = data_leaf(arr, t._meta[0], t._meta[1])
        t._storage.version += 1
    partial_barrier()
    return arr, checks, checked, me


@guard
def to_cpu(t: LazyTensor) -> torch.Tensor:
    """A CPU copy of ``t`` (a host transfer).

    NOTE: the wait for the device runs with the lock released (:func:`threads.released`), so
    other threads record while this one waits; the copy itself is taken under the lock, from
    ``t``'s current value if another thread's step consumed the awaited buffer meanwhile.
    """
    with threads.held():
        read = value_of(t) if STATE.capturing else None
        arr, checks, checked, me = _materialize(t)
        if read is not None:
            state.log_capture(("read", read, value_of(t)))
        with threads.released():
            _await([arr, *checked])
            index_checks.verify_launched(me)
            index_checks.verify(checks, checked)
        if isinstance(arr, jax.Array) and arr.is_deleted():
            arr = _materialize(t)[0]
        metrics._COUNTS["transfers_to_host"] += 1
        host = np.array(arr)
    dtype = t._meta[1]
    if dtype == torch.bfloat16:
        return torch.from_numpy(host.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(host).reshape(t._meta[0])


def to_device(cpu: torch.Tensor) -> Node:
    """A device-data leaf with the contents of CPU tensor ``cpu`` (a host transfer)."""
    metrics._COUNTS["transfers_to_device"] += 1
    jd = to_jax(cpu.dtype)
    c = cpu.detach()
    host = c.float().numpy().astype(jd) if cpu.dtype == torch.bfloat16 else c.resolve_conj().resolve_neg().numpy()
    arr = jax.device_put(np.array(host, copy=True, order="C"))  # NOTE: a copy: CPU JAX may alias numpy memory
    leaf = data_leaf(arr, tuple(cpu.shape), cpu.dtype)
    state.log_capture(("host", leaf))
    return leaf
