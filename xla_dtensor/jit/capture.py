"""Capture: run a function lazily once and record it as a pure program.

The program maps leaf arrays to (new values of mutated storages, new gradients,
outputs). Each leaf gets a *source*, which says where a later call finds its value:

* ``("arg", k)``: the storage of the call's ``k``-th flat tensor argument;
* ``("cap", ref, hash)``: a storage that existed before the call (a parameter,
  optimizer state), held by weak reference;
* ``("grad", holders, hash)``: the gradient a parameter held when the call began, read
  through the parameter (``holders``: ``(weakref to parameter, view chain key)``, first
  the one read), so a call sees that call's gradients, also when ``fn`` clears them;
* ``("freed", shape)``: a storage that existed before the call, was freed by it and no
  argument reaches: a later call cannot find its value, so the call is never replayed;
* ``("key",)``: a fresh PRNG key, drawn from the device generator;
* ``("host", k, dtype)``: a CPU tensor argument moved to the device inside ``fn``;
* ``("hyper", expr)``: a Python scalar computed from the optimizers' hyperparameters
  (:mod:`xla_dtensor.jit.hyper`), recomputed from their current values on every call;
* ``("const", value)``: anything else (Python scalars, tensors built inside ``fn``).

Before a trace, the optimizers' equal 0-d state tensors (torch keeps one step counter
per parameter) are made to share one value (:func:`share_equal_scalars`): one program
input, and, where their updates are provably equal, one output. The replay checks they
still share it (``aliases``).

Gradients: the replay checks that each parameter has a gradient exactly when it had
one at trace time (``grad_present``; if not, it traces a new program for the signature);
it sets those ``fn`` created or replaced (``grads``) and clears those ``fn`` set to None
(``cleared``: ``zero_grad()`` inside).

NOTE: constants are exact only if ``fn`` has no data-dependent Python; a capture
that read device values derived from its inputs on the host (``host_reads``; reads of
values computed from constants alone are replayable, :mod:`xla_dtensor.jit.host_reads`)
or a freed input (``freed``) is never replayed.
"""
from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree

from xla_dtensor.core import executor
from xla_dtensor.core.state import capturing
from xla_dtensor.core import ir_args as A
from xla_dtensor.core import tensor as T
from xla_dtensor.core.ir import DATA, GETITEM, PARAM, Node
from xla_dtensor.core.signature import op_info
from xla_dtensor.core.tensor import LazyTensor, Storage, is_view, live, meta_of, storage_of, value_of
from xla_dtensor.jit import host_reads as HR
from xla_dtensor.jit import layouts, padded
from xla_dtensor.jit.args import chain_key
from xla_dtensor.jit.names import leaf_names, tensor_names
from xla_dtensor.core import layout as L


@dataclass
class Capture:
    """What one traced call did (see the module docstring)."""

    roots: list[Node]
    leaves: list[Node]
    struct: tuple
    fns: list
    wiring: list
    outs: list[int]
    ops: list[str]
    sources: list[tuple]
    state: list[tuple]          # (source of the written storage, storage meta) per mutated storage
    grads: list[tuple]          # (weakref to parameter, grad meta) per gradient created or replaced by fn
    out_items: list[Any]        # per output leaf: ("t", meta) or ("py", value)
    out_spec: Any
    donate: tuple[int, ...]
    state_leaf: list[int]       # per mutated storage, the leaf index of its value before the call (-1: not a leaf)
    escaped: int = 0            # new tensors kept alive outside the outputs (state created on this call)
    host_reads: int = 0         # device values derived from the call's inputs read on the host while tracing
    const_reads: int = 0        # device values computed from constants alone read on the host (replayable)
    freed: list = field(default_factory=list)  # shapes of the inputs fn freed that no argument reaches
    cleared: list = field(default_factory=list)  # weakrefs of the parameters whose gradient fn set to None
    grad_present: list = field(default_factory=list)  # (weakref to parameter, had a gradient) per parameter
    shardings: list = field(default_factory=list)
    res_of: list[int] = field(default_factory=list)  # per written storage, gradient and output: its result index
    aliases: list[tuple] = field(default_factory=list)  # (leaf index, weakrefs of the other storages holding it)
    split_merge: bool = False   # storages merged by share_equal_scalars got different new values
    settle: list = field(default_factory=list)  # (leaf, weakrefs of its holders, layout) per input to settle
    names: list = field(default_factory=list)  # per leaf, the name of the tensor it is read from, or None
    uneven: int = 0             # padded (unevenly sharded) values other than uneven storages' reads and writes
    padded_in: set = field(default_factory=set)  # leaves read as the padded data under an uneven storage's value
    unpad: dict = field(default_factory=dict)  # written storage index -> (shape, sharding) to unpad its result to
    keys: list = field(default_factory=list)  # per node (topological order), its key (for messages)
    node_names: dict = field(default_factory=dict)  # node position of a leaf -> names[leaf]
    hyper: list = field(default_factory=list)  # the optimizers' float hyperparameters (jit.hyper.bases)
    hyper_values: tuple = ()    # their values when traced
    hyper_guards: list = field(default_factory=list)  # comparisons made on them while tracing


def _params(flat: list) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for x in flat:
        if isinstance(x, torch.nn.Module):
            for p in x.parameters():
                seen.setdefault(id(p), p)
        elif isinstance(x, torch.optim.Optimizer):
            for g in x.param_groups:
                for p in g["params"]:
                    seen.setdefault(id(p), p)
    return [p for p in seen.values() if isinstance(p, LazyTensor)]


def make_capturable(flat: list) -> None:
    """Switch torch optimizers among the arguments to ``capturable=True``.

    A non-capturable optimizer keeps its step counter on the host and folds it into
    Python scalars, which a replay cannot see change; the capturable path keeps the
    counter on the device, inside the program.
    """
    for x in flat:
        if not isinstance(x, torch.optim.Optimizer):
            continue
        for g in x.param_groups:
            if g.get("capturable") is False:
                g["capturable"] = True
                for p in g["params"]:
                    st = x.state.get(p)
                    step = st.get("step") if st else None
                    if isinstance(step, torch.Tensor) and not isinstance(step, LazyTensor):
                        st["step"] = step.to(p.device)


def share_equal_scalars(flat: list) -> int:
    """Let the equal 0-d state tensors of the optimizers in ``flat`` (the call's arguments) share
    one value; returns how many were rebound.

    torch's Adam/AdamW keep one step counter per parameter, all equal. Holding one value,
    they are one program input: XLA computes the per-parameter bias corrections once
    (111 scalar kernels in the benchmark GPT-2 step, 4 in JAX's single-count step) and
    :func:`capture` gives their equal updates one program output. Values are compared on
    the host, bit for bit (a read of each scalar, at trace time only). Sharing an
    immutable value changes nothing a tensor holds; a later write to one of them
    rebinds that one alone, which the replay notices (``Capture.aliases``).
    """
    by_id: dict[int, Storage] = {}
    for x in flat:
        if isinstance(x, torch.optim.Optimizer):
            for st in x.state.values():
                for t in st.values():
                    if isinstance(t, LazyTensor) and not is_view(t) and t.dim() == 0:
                        v = storage_of(t).value
                        if v.op == DATA and v.fn is None:
                            by_id.setdefault(id(storage_of(t)), storage_of(t))
    found = list(by_id.values())
    if len(found) < 2:
        return 0
    values = jax.device_get([s.value.data for s in found])
    groups: dict[tuple, Node] = {}
    n = 0
    for s, v in zip(found, values):
        rep = groups.setdefault((s.value.key, np.asarray(v).tobytes()), s.value)
        if s.value is not rep:
            s.value = rep
            s.version += 1
            n += 1
    return n


def capture(fn: Any, args: tuple, kwargs: dict, flat: list) -> tuple[Capture, Any]:
    """Run ``fn`` lazily and record it. Returns the capture and ``fn``'s own result."""
    # NOTE: in creation order: a WeakSet's iteration order depends on its insertion/deletion history,
    # and the program's input/output order (hence the re-check's structural compare) must not.
    before = {id(s): (weakref.ref(s), s.value) for s in sorted(live(), key=_seq)}
    start = next(T._SEQ)
    params = _params(flat)
    grad_at, grad_before = _grads_at_start(params)
    with capturing() as log:
        out = fn(*args, **kwargs)
    host_reads, const_reads = HR.classify(log, _cpu_args(flat))
    del log
    out_leaves, out_spec = pytree.tree_flatten(out)
    out_storages = {id(storage_of(t)) for t in out_leaves if isinstance(t, LazyTensor)}

    grads: list[tuple] = []
    cleared: list = []
    grad_storages: dict[int, Storage] = {}
    for p in params:
        g, was = p.grad, grad_before.get(id(p))
        if isinstance(g, LazyTensor) and (was is None or was() is not g):
            grads.append((weakref.ref(p), meta_of(g)))  # NOTE: may be a view (a transposed mm result)
            grad_storages[id(storage_of(g))] = storage_of(g)
        elif g is None and was is not None:
            cleared.append(weakref.ref(p))
    escaped = _escaped(start, out_storages, grad_storages)
    if escaped:
        gc.collect()
        escaped = _escaped(start, out_storages, grad_storages)

    arg_of = {id(storage_of(t)): k for k, t in enumerate(flat) if isinstance(t, LazyTensor)}
    state, mutated, written, written_old, wstorages = [], set(), [], [], []
    for sid, (ref, old) in before.items():
        s = ref()
        if s is None or s.value is old:
            continue
        mutated.add(id(old))
        src = ("arg", arg_of[sid]) if sid in arg_of else ("grad", grad_at[sid]) if sid in grad_at else ("cap", ref)
        state.append((src, s.meta))
        written.append(sid)
        written_old.append(old)
        wstorages.append(s)
    out_tensors = [t for t in out_leaves if isinstance(t, LazyTensor)]
    layouts.run_hooks(live())  # NOTE: every pending storage, as sync() would: a path that syncs next skips them
    roots = _roots(wstorages, grads, out_tensors)
    mesh = layouts.settle_state(executor.make_plan(roots), wstorages, written_old, [ref() for ref, _ in grads],
                                [x for x in flat if isinstance(x, torch.optim.Optimizer)], start)
    if mesh is not None:
        roots = _roots(wstorages, grads, out_tensors)
    out_items = [("t", meta_of(t)) if isinstance(t, LazyTensor) else ("py", t) for t in out_leaves]

    plan = executor.make_plan(roots)
    struct, leaves, fns, wiring = plan.struct, plan.leaves, plan.fns, plan.wiring
    outs = list(dict.fromkeys(plan.outs))  # a value written to several storages is one program output
    at = {p: k for k, p in enumerate(outs)}
    res_of = [at[p] for p in plan.outs]
    order_ops = [str(n.op) for n in plan.order]
    # id(value before the call) -> [(storage id, ref)] of the live storages holding it; the same over every
    # storage of the call's start, freed ones included; the padded leaves under uneven storages
    holders, held, padded_ids = padded.holders_with_padded(before)
    sources = _sources(leaves, holders, held, grad_at, arg_of, flat)
    written_res = dict(zip(written, res_of))
    aliases, split = _aliases(leaves, holders, written_res)
    # a leaf is donated when every storage that held it was overwritten by the call
    donate = tuple(i for i, n in enumerate(leaves) if sources[i][0] in ("arg", "cap") and executor.donatable(n)
                   and all(sid in written_res for sid, _ in holders[id(n)]))
    leaf_at = {id(n): i for i, n in enumerate(leaves)}
    state_leaf = [leaf_at.get(id(padded.read_leaf(old)), -1) for old in written_old]
    cap = Capture(roots, leaves, struct, fns, wiring, outs, order_ops, sources, state, grads, out_items,
                  out_spec, donate, state_leaf, escaped, host_reads, const_reads)
    cap.shardings, cap.res_of, cap.aliases, cap.split_merge = plan.shardings, res_of, aliases, split
    cap.freed = [src[1] for src in sources if src[0] == "freed"]
    cap.cleared = cleared
    cap.grad_present = [(weakref.ref(p), id(p) in grad_before) for p in params]
    if mesh is not None:  # inputs on one device in a program on several: replicated from the next call on
        rep = layouts.replicated(mesh)
        cap.settle = [(n, [ref for _, ref in holders.get(id(n), ())], rep) for i, n in enumerate(leaves)
                      if sources[i][0] in ("cap", "grad") and layouts.single_device(n)]
    cap.names = leaf_names(sources, tensor_names(flat), flat)
    cap.keys = [n.key for n in plan.order]
    cap.padded_in = {i for i, n in enumerate(leaves) if id(n) in padded_ids and sources[i][0] in ("arg", "cap")}
    cap.unpad = padded.state_unpad(wstorages)
    cap.uneven = padded.unsupported(plan.order, roots[:len(wstorages)], {id(leaves[i]) for i in cap.padded_in})
    leaf_pos = [k for k, n in enumerate(plan.order) if n.fn is None]
    cap.node_names = dict(zip(leaf_pos, cap.names))
    return cap, out


def _roots(written: list[Storage], grads: list[tuple], out_tensors: list[LazyTensor]) -> list[Node]:
    """The program's results: the written storages' values (equal foreach items merged), the new
    gradients, the outputs."""
    roots = _merged_items([s.value for s in written])
    roots += [value_of(ref().grad) for ref, _ in grads]
    return roots + [value_of(t) for t in out_tensors]


def _grads_at_start(params: list[torch.Tensor]) -> tuple[dict[int, list], dict[int, Any]]:
    """The parameters' gradients at the start of a call: id(storage) -> [(weakref to parameter,
    view chain key)] of the parameters whose gradient is (a view of) that storage, and
    id(parameter) -> weakref to its gradient.

    NOTE: weak references: a strong one would keep a gradient that ``fn`` clears alive.
    """
    at: dict[int, list] = {}
    before: dict[int, Any] = {}
    for p in params:
        g = p.grad
        if g is None:
            continue
        before[id(p)] = weakref.ref(g)
        if isinstance(g, LazyTensor):
            at.setdefault(id(storage_of(g)), []).append((weakref.ref(p), chain_key(g)))
    return at, before


def _seq(s: Storage) -> int:
    return s.seq


def _escaped(start: int, out_storages: set[int], grad_storages: dict[int, Storage]) -> int:
    n = 0
    for s in live():
        if s.seq > start and id(s) not in out_storages and id(s) not in grad_storages:
            n += 1
    return n


def _merged_items(roots: list[Node]) -> list[Node]:
    """``roots`` with equal outputs of one ``_foreach_*`` node replaced by the first of them.

    Output ``i`` of a foreach op is computed from element ``i`` of its list arguments and
    its shared arguments alone, so two outputs whose elements are the same nodes are equal
    (the step counters' ``_foreach_add_`` once they share one value). An item under a
    sharding constraint (a pinned layout) merges with those under the same constraint.
    """
    first: dict[tuple, Node] = {}
    slot_of: dict[int, list] = {}
    out = []
    for r in roots:
        item = r.inputs[0] if r.fn is not None and L.is_constraint(r) else r
        node = item.inputs[0] if item.op == GETITEM else None
        if node is None or not str(node.op).startswith("aten._foreach_") or len(op_info(node.op).mutated) > 1:
            out.append(r)
            continue
        slots = slot_of.get(id(node))
        if slots is None:
            try:
                slots = slot_of[id(node)] = A.layout(node)
            except KeyError:  # no signature entry to read the layout from: leave it unmerged
                out.append(r)
                continue
        i = item.key[1]
        key = (id(node), tuple(id(x) for sl, x in zip(slots, node.inputs) if sl.item == i), r.sharding)
        out.append(first.setdefault(key, r))
    return out


def _aliases(leaves: list[Node], holders: dict[int, list], written: dict[int, int]) -> tuple[list[tuple], bool]:
    """Storages that held one leaf when traced (besides its source), and whether their new values split.

    The replay passes such a leaf once, so it checks that the other storages still hold
    the source's array. ``written`` maps each storage the call wrote to its result. A
    group whose storages were written with different values (or only some of them)
    cannot stay shared: ``split`` says so, and the call is not cached.
    """
    aliases, split = [], False
    for i, n in enumerate(leaves):
        group = holders.get(id(n), [])
        if len(group) > 1:
            aliases.append((i, [ref for _, ref in group[1:]]))
            split = split or len({written.get(sid) for sid, _ in group}) > 1
    return aliases, split


def _sources(leaves: list[Node], holders: dict[int, list], held: dict[int, list], grad_at: dict[int, list],
             arg_of: dict, flat: list) -> list[tuple]:
    """Where a later call finds each leaf (see the module docstring).

    A held leaf's source is its first live holder if that is an argument, else the gradient
    holding it (read through its parameter: the next call's gradient is a new tensor),
    else its first live holder.
    """
    hosts = _cpu_args(flat)
    out = []
    for n in leaves:
        live, sids = holders.get(id(n)), held.get(id(n), ())
        grad = next((s for s in sids if s in grad_at), None)
        if n.op == PARAM:
            out.append(("const", n.data))
        elif n.op == DATA and n.key[2] == "key":
            out.append(("key",))
        elif live and live[0][0] in arg_of:
            out.append(("arg", arg_of[live[0][0]]))
        elif grad is not None:
            out.append(("grad", grad_at[grad], n.hash))
        elif live:
            out.append(("cap", live[0][1], n.hash))
        elif sids:
            out.append(("freed", tuple(n.key[1])))
        else:
            out.append(_host_source(n, hosts))
    return out


def _cpu_args(flat: list) -> list[tuple[int, torch.Tensor]]:
    return [(k, t) for k, t in enumerate(flat) if isinstance(t, torch.Tensor) and not isinstance(t, LazyTensor)]


def _host_source(n: Node, hosts: list) -> tuple:
    data = n.data
    shape = tuple(getattr(data, "shape", ()))
    for k, t in hosts:
        if tuple(t.shape) == shape and shape and np.array_equal(np.asarray(data), HR.host_array(t, n.key[2])):
            return ("host", k, n.key[2])
    return ("const", data)

