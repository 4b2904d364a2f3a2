"""A cached program and how to feed it: gather a call's leaf arrays, run, rebind.

A replay touches no aten op and no IR: it reads the current arrays of the recorded
storages and of the parameters' current gradients (checking each is still device data
of the traced shape, dtype and sharding: its leaf hash), calls the compiled executable,
rebinds the mutated storages to the results, sets the gradients the function created
or replaced, clears those it cleared, and wraps the outputs.
"""
from __future__ import annotations

import math
from typing import Any

import jax
from torch.utils import _pytree as pytree

from xla_dtensor import metrics
from xla_dtensor.core import executor
from xla_dtensor.jit.capture import Capture
from xla_dtensor.jit.host_reads import host_array
from xla_dtensor.core.ir import DATA, Node, data_leaf
from xla_dtensor.core.tensor import LazyTensor, new_tensor, storage_of
from xla_dtensor.jit import describe, hyper
from xla_dtensor.core import layout as L
from xla_dtensor.jit.args import chain_key
from xla_dtensor.random import next_key


LAYOUT_CHANGED = "an input differs from the traced one"
SHARED_SPLIT = "tensors that held one value when traced (equal optimizer step counters) no longer do"
GRADS_CHANGED = "gradients differ from the traced call"


class NewProgram(str):
    """Why a call does not fit its signature's program when the fit is a different program on
    purpose (shared step counters split, other gradients), not a changed graph."""


_REPLICATE_MAX = 1 << 12  # elements of a one-device input replicated at replay (scalars, small vectors)


class Recheck(str):
    """A hyperparameter changed for the first time since the trace: re-trace once and compare
    (a value derived from it outside the recorded arithmetic would show as a changed constant)."""



class Entry:
    """One signature's program (see the module docstring)."""

    __slots__ = ("compiled", "template", "arg_in", "cap_in", "grad_in", "key_in", "host_in", "grad_present",
                 "cleared", "state_w", "grad_w", "out_w", "out_spec", "donate", "keep", "struct", "ops", "sources",
                 "calls", "always_trace", "n_in", "n_out", "alias_in", "keys", "node_names", "in_info", "pad_in",
                 "names", "hyper_where", "hyper_in", "hyper_guards", "hyper_values", "hyper_checked",
                 "hyper_last")

    def __init__(self, cap: Capture, compiled: Any, results: list) -> None:
        self.compiled, self.struct, self.ops, self.sources = compiled, cap.struct, cap.ops, cap.sources
        self.keys, self.node_names, self.names = cap.keys, cap.node_names, cap.names
        self.in_info: dict[int, tuple] = {}  # program input -> (tensor name, traced leaf key), for messages
        self.calls, self.always_trace = 0, False
        self.n_in, self.n_out = len(cap.leaves), len(results)
        pos = {i: j for j, i in enumerate(arg_order(cap))}
        self.template: list[Any] = [None] * len(pos)
        self.arg_in, self.cap_in, self.grad_in, self.key_in, self.host_in = [], [], [], [], []
        self.pad_in: list[tuple] = []  # (input, "arg" or "cap", argument index or storage ref, hash): uneven storages
        self.hyper_in: list[tuple] = []  # (input, expression over the hyperparameters, sharding)
        self.hyper_where, self.hyper_guards, self.hyper_values = cap.hyper, cap.hyper_guards, cap.hyper_values
        self.hyper_checked: set[int] = set()  # hyperparameters seen changing and re-checked
        self.hyper_last: tuple = (None, None)  # (values, their device arrays) of the last call
        in_shardings = compiled.input_shardings[0] if any(s[0] == "hyper" for s in cap.sources) else ()
        for k, (src, n) in enumerate(zip(cap.sources, cap.leaves)):
            if k not in pos:  # a baked constant
                continue
            i, kind = pos[k], src[0]
            self.in_info[i] = (cap.names[k] if k < len(cap.names) else None, n.key)
            if k in cap.padded_in:
                self.pad_in.append((i, kind, src[1], n.hash))
            elif kind == "arg":
                self.arg_in.append((i, src[1], n.hash))
            elif kind == "cap":
                self.cap_in.append((i, src[1], src[2]))
            elif kind == "grad":
                self.grad_in.append((i, src[1], src[2]))
            elif kind == "key":
                self.key_in.append(i)
            elif kind == "host":
                self.host_in.append((i, src[1], src[2]))
            elif kind == "hyper":
                self.hyper_in.append((i, src[1], in_shardings[i]))
            else:
                self.template[i] = src[1]
        self.donate = tuple(pos[i] for i in cap.donate)
        dset = set(cap.donate)
        self.keep = [pos[i] for i, src in enumerate(cap.sources) if src[0] in ("arg", "cap") and i not in dset]
        metas = [m for _, m in cap.state] + [m for _, m in cap.grads] + [it[1] for it in cap.out_items if it[0] == "t"]
        keys = []
        for j, (r, meta) in enumerate(zip(cap.res_of, metas)):  # NOTE: per written storage / gradient / output
            shape = tuple(results[r].shape) if j in cap.unpad else meta[0]  # an uneven storage's padded result
            leaf = data_leaf(results[r], shape, meta[1])
            keys.append((r, leaf.key, leaf.hash))
        ns = len(cap.state)
        # per result: its leaf key and hash, the captured storages it is written to (by weak
        # reference: the common case, parameters and optimizer state) and the others
        # (arguments, gradients). NOTE: one loop per result, not per storage: 0.54 -> 0.45 ms
        # (with the freeing of the replaced values) for the 6-layer GPT-2's 400 storages
        groups: dict[int, tuple] = {}
        for j, (src, _) in enumerate(cap.state):
            r, key, h = keys[j]
            g = groups.setdefault(r, (r, key, h, [], [], cap.unpad.get(j)))
            if src[0] == "cap":
                g[3].append(src[1])
            else:
                g[4].append(src)
        self.state_w = list(groups.values())
        self.grad_w = [(ref, meta, *keys[ns + j]) for j, (ref, meta) in enumerate(cap.grads)]
        self.grad_present, self.cleared = cap.grad_present, cap.cleared
        self.alias_in = [(pos[i], refs) for i, refs in cap.aliases if i in pos]
        j = ns + len(cap.grads)
        self.out_w = []
        for it in cap.out_items:
            if it[0] == "t":
                self.out_w.append(("t", it[1], *keys[j]))
                j += 1
            else:
                self.out_w.append(it)
        self.out_spec = cap.out_spec

    def gather(self, flat: list) -> list | str:
        """The inputs of this call, or the reason they do not fit the program."""
        inputs = self.template.copy()
        for i, k, h in self.arg_in:
            v = storage_of(flat[k]).value
            if v.hash != h and not self.heal(i, v):
                arr = self.replicate(i, v)
                if arr is None:
                    return self.mismatch(i, v)
                inputs[i] = arr
                continue
            inputs[i] = v.data
        for i, ref, h in self.cap_in:
            s = ref()
            if s is None:
                return f"captured tensor (program input {i}) was freed"
            v = s.value
            if v.hash != h and not self.heal(i, v):
                arr = self.replicate(i, v)
                if arr is None:
                    return self.mismatch(i, v)
                inputs[i] = arr
                continue
            inputs[i] = v.data
        for ref, had in self.grad_present:
            p = ref()
            if p is None:
                return "a parameter of the traced call was freed"
            if (p.grad is not None) is not had:
                return NewProgram(f"{GRADS_CHANGED}: a parameter of shape {list(p.shape)} "
                                  + ("had a gradient when traced and has none now" if had else
                                     "had no gradient when traced and has one now (zero_grad(set_to_none=False)?)"))
        for i, holders, h in self.grad_in:
            v = _grad_value(holders, h)
            if type(v) is NewProgram:
                return v
            if type(v) is Node:
                if not self.heal(i, v):
                    return self.mismatch(i, v)
                v = v.data
            inputs[i] = v
        for i, kind, src, h in self.pad_in:  # uneven storages: the padded data under their unpad
            s = storage_of(flat[src]) if kind == "arg" else src()
            if s is None:
                return f"captured tensor (program input {i}) was freed"
            v = L.padded_source(s.value)
            if v is None or (v.hash != h and not self.heal(i, v)):
                return self.mismatch(i, s.value if v is None else v)
            inputs[i] = v.data
        for i in self.key_in:
            inputs[i] = next_key()
        for i, k, dtype in self.host_in:
            inputs[i] = jax.device_put(host_array(flat[k], dtype))
            metrics._COUNTS["transfers_to_device"] += 1
        if self.hyper_where:
            why = self.hyper_inputs(flat, inputs)
            if why is not None:
                return why
        for i, refs in self.alias_in:  # storages that shared one value when traced (equal step counters)
            for ref in refs:
                s = ref()
                if s is None or s.value.data is not inputs[i]:
                    return NewProgram(SHARED_SPLIT + f" (program input {i})")
        if self.donate:
            ids = {id(inputs[i]) for i in self.donate}
            if len(ids) < len(self.donate) or any(id(inputs[i]) in ids for i in self.keep):
                return "a donated buffer is shared with another input"
        return inputs

    def hyper_inputs(self, flat: list, inputs: list) -> str | None:
        """Put this call's hyperparameter-derived scalars into ``inputs``; else why they do not fit."""
        vals = hyper.values(flat, self.hyper_where)
        if vals is None:
            return NewProgram("an optimizer hyperparameter is no longer a float or a 0-d CPU tensor")
        last, arrays = self.hyper_last
        if vals != last:
            if vals != self.hyper_values:
                if not hyper.guards_hold(self.hyper_guards, vals):
                    return NewProgram("a comparison on an optimizer hyperparameter made while tracing "
                                      "(or its value 0 or 1, a literal) came out differently")
                changed = {i for i, (a, b) in enumerate(zip(vals, self.hyper_values)) if a != b}
                if not changed <= self.hyper_checked:
                    names = sorted({self.hyper_where[i][2] for i in changed - self.hyper_checked})
                    return Recheck(f"first change of optimizer hyperparameter(s) {', '.join(names)}: "
                                   f"re-traced once to compare")
            arrays = [jax.device_put(jax.numpy.asarray(hyper.evaluate(e, vals)), sh) for _, e, sh in self.hyper_in]
            metrics._COUNTS["transfers_to_device"] += len(arrays)
            self.hyper_last = (vals, arrays)
        for (i, _, _), a in zip(self.hyper_in, arrays):
            inputs[i] = a
        return None

    def heal(self, i: int, value: Node) -> bool:
        """Whether program input ``i``'s new value is device data of the traced shape and dtype in an
        equivalent layout (``P('d', None)`` traced, ``P('d',)`` now: XLA returns its outputs' specs
        without trailing ``None`` s); if so this entry expects its hash from now on.

        NOTE: the slow path of a replay, taken once per input whose layout object changed.
        """
        name, key = self.in_info.get(i, (None, None))
        if key is None or value.op != DATA or value.fn is not None or value.key[1:3] != key[1:3]:
            return False
        old, new = key[3], value.key[3]
        if old is None or new is None or not new.is_equivalent_to(old, len(key[1])):
            return False
        h = value.hash
        self.arg_in = [(a, k, h if a == i else x) for a, k, x in self.arg_in]
        self.cap_in = [(a, r, h if a == i else x) for a, r, x in self.cap_in]
        self.grad_in = [(a, r, h if a == i else x) for a, r, x in self.grad_in]
        self.pad_in = [(a, kd, r, h if a == i else x) for a, kd, r, x in self.pad_in]
        self.in_info[i] = (name, value.key)
        return True

    def replicate(self, i: int, value: Node) -> Any:
        """Program input ``i`` traced replicated over the mesh, now a small array on one device
        (a tensor lr that a scheduler's ``fill_`` rewrote on one device every step): the array
        replicated for this call; else ``None``."""
        _, key = self.in_info.get(i, (None, None))
        if key is None or value.op != DATA or value.fn is not None or value.key[1:3] != key[1:3]:
            return None
        old, new = key[3], value.key[3]
        if old is None or new is None or not old.is_fully_replicated or len(new.device_set) != 1 \
                or len(old.device_set) == 1 or math.prod(key[1]) > _REPLICATE_MAX:
            return None
        metrics._COUNTS["transfers_to_device"] += 1
        return jax.device_put(value.data, old)

    def mismatch(self, i: int, value: Node) -> NewProgram:
        """Program input ``i`` holds ``value``, which is not the traced device data: a new program
        for new input layouts (or shapes), not a changed graph."""
        name, key = self.in_info.get(i, (None, None))
        if key is None:
            return NewProgram(f"program input {i} changed")
        return NewProgram(f"{LAYOUT_CHANGED}: {describe.mismatch(name, key, value)}")

    def apply(self, results: list, flat: list, unpad: bool = True) -> Any:
        """Rebind mutated storages, set new gradients, and build the outputs.

        Storages written with one result share one value node (so they stay one input).
        An uneven storage gets ``unpad`` of its padded result (``unpad=False``: the padded
        data itself, for the sync hook that unpads it after the traced call).
        """
        for r, key, h, refs, others, shape_sharding in self.state_w:
            node = Node(DATA, key, (), h, None, results[r])
            if shape_sharding is not None and unpad:
                node = L.unpad(node, *shape_sharding)
            for ref in refs:
                s = ref()
                s.value = node
                s.version += 1
            for src in others:
                s = storage_of(flat[src[1]]) if src[0] == "arg" else storage_of(src[1][0][0]().grad)
                s.value = node
                s.version += 1
        for ref, meta, r, key, h in self.grad_w:
            ref().grad = new_tensor(meta, Node(DATA, key, (), h, None, results[r]))
        for ref in self.cleared:
            ref().grad = None
        outs = []
        for it in self.out_w:
            if it[0] == "t":
                outs.append(new_tensor(it[1], Node(DATA, it[3], (), it[4], None, results[it[2]])))
            else:
                outs.append(it[1])
        return pytree.tree_unflatten(outs, self.out_spec)


def _grad_value(holders: list, h: int) -> Any:
    """The array of the gradient the first of ``holders`` (``(parameter ref, view chain key)``)
    holds; else why it does not fit (a :class:`NewProgram`: no gradient, another view chain or
    storage), or the value it holds when that is not the traced device data (a ``Node``)."""
    storage = None
    for ref, chain in holders:
        p = ref()
        g = None if p is None else p.grad
        if not isinstance(g, LazyTensor) or chain_key(g) != chain:
            return NewProgram(f"{GRADS_CHANGED}: a gradient is missing or is another view than when traced")
        if storage is None:
            storage = storage_of(g)
        elif storage_of(g) is not storage:
            return NewProgram(f"{GRADS_CHANGED}: gradients that were views of one tensor when traced no longer are")
    v = storage.value
    if v.hash != h:
        return v  # the caller names it
    return v.data


def baked_constants(cap: Capture) -> dict[int, Any]:
    """Leaf index -> value of the Python-scalar constants, compiled into the program as literals.

    NOTE: passing ~10^2 Python scalars (per-tensor optimizer coefficients) as arguments
    costs milliseconds per call; as literals they cost nothing, and a changed value is a
    new signature (optimizer hyperparameters) or caught by the periodic re-check.
    """
    return {i: src[1] for i, src in enumerate(cap.sources)
            if src[0] == "const" and type(src[1]) in (int, float, bool, complex)}


def arg_order(cap: Capture) -> list[int]:
    """The leaves passed to the program (all but the baked constants), in argument order.

    Donated leaves come last, in the order of the state outputs that overwrite them
    (:func:`xla_dtensor.core.executor.arg_order` says why).
    """
    baked = baked_constants(cap)
    order = executor.arg_order(len(cap.leaves), set(cap.donate), cap.state_leaf)
    return [i for i in order if i not in baked]


def first_inputs(cap: Capture) -> list:
    """The program inputs of the traced call itself (the non-baked leaves' current arrays, argument order)."""
    return [cap.leaves[i].data for i in arg_order(cap)]


def compare(entry: Entry, cap: Capture) -> str | None:
    """``None`` if ``cap`` recorded the same program with the same sources, else what differs."""
    if entry.struct != cap.struct:
        return describe.first_difference((entry.struct, entry.ops, entry.keys, entry.node_names),
                                         (cap.struct, cap.ops, cap.keys, cap.node_names))
    for i, (s0, s1) in enumerate(zip(entry.sources, cap.sources)):
        was, now = _named(i, entry.names), _named(i, cap.names)
        if s0[0] != s1[0]:
            return f"program input {i} comes from {s1[0]!r}{now}, was {s0[0]!r}{was}"
        if s0[0] == "cap" and s0[1]() is not s1[1]():
            return f"program input {i} reads a different tensor{now} than when traced{was}"
        if s0[0] == "grad" and s0[1][0][0]() is not s1[1][0][0]():
            return f"program input {i} reads the {now.strip(' ()') or 'gradient of another parameter'}, was{was}"
        if s0[0] in ("arg", "host") and s0[1] != s1[1]:
            return f"program input {i} reads argument #{s1[1]}, was #{s0[1]}"
        if s0[0] == "hyper" and s0[1] != s1[1]:
            return f"program input {i} is computed from the optimizer hyperparameters as {s1[1]}, was {s0[1]}"
        if s0[0] == "const" and not _same(s0[1], s1[1]):
            return f"constant program input {i} was {_short(s0[1])}, now {_short(s1[1])} (data-dependent Python?)"
    return None


def _named(i: int, names: list) -> str:
    name = names[i] if i < len(names) else None
    return f" ({name})" if name else ""


def _same(a: Any, b: Any) -> bool:
    if hasattr(a, "shape") or hasattr(b, "shape"):
        import numpy as np
        return bool(np.array_equal(np.asarray(a), np.asarray(b)))
    return type(a) is type(b) and a == b


def _short(v: Any) -> str:
    return f"array{list(v.shape)}" if hasattr(v, "shape") and getattr(v, "ndim", 0) else repr(v)
