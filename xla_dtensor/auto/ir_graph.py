"""The lazy core's pending IR -> :class:`autoshard.graph.Graph` (the graph autoshard plans over).

The result has the structure :func:`autoshard.fx_builder.graph_from_fx` builds from a
``make_fx`` trace of the same step: one placeholder per parameter, optimizer-state
slot and batch input (placeholders first), then one node per recorded aten op in a
topological order of the IR; ``getitem`` becomes an output index, traced Python
scalars become plain arguments, each ``_foreach_*`` op becomes one node per list
element, and an in-place op yields a new version of the tensor it mutates, joined to
that tensor's alias group (parameter <-> its optimizer state <-> their updates).

How a training step looks in the IR: a storage that the step updates in place (a
parameter, ``exp_avg``) is *rebound*: its value is the last in-place op's output and
walking back through the ops' mutated inputs reaches its *base*, the device-data
leaf it held at the start of the step (or, on the first step, the ``zeros_like``
that created the optimizer state, which becomes a placeholder like the leaf).

Example:
    >>> import torch, xla_dtensor
    >>> lin = torch.nn.Linear(4, 2).to(xla_dtensor.device())
    >>> xla_dtensor.sync()
    >>> opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    >>> lin(torch.ones(8, 4, device=xla_dtensor.device())).sum().backward()
    >>> opt.step()
    >>> params, state = step_roles(lin, opt)
    >>> g = graph_from_ir(params=params, opt_state=state)
    >>> sorted(n.name for n in g.nodes if n.role == "param"), len(g.grads)
    (['bias', 'weight'], 2)
    >>> xla_dtensor.sync()
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from autoshard.graph import Graph, TensorMeta
from autoshard.strategies.optimizer import FUSED_STEPS
from xla_dtensor.core import ir_args as A
from xla_dtensor.core.ir import DATA, GETITEM, PARAM, Node
from xla_dtensor.core.signature import op_info
from xla_dtensor.core.tensor import LazyTensor, Storage, pending, storage_of, value_of

__all__ = ["graph_from_ir", "graph_from_ir_with_nodes", "pending_storages", "step_roles"]

# ops that create a fresh tensor; as the base of an in-place chain they become a placeholder
_FRESH = ("aten.zeros_like", "aten.empty_like", "aten.ones_like", "aten.full_like", "aten.zeros",
          "aten.empty", "aten.full", "aten.ones")
Ref = tuple[int, int]


def pending_storages() -> list[Storage]:
    """Live storages whose value is pending, in creation order: what ``sync()`` would run."""
    return pending()[0]


def step_roles(module: Any, optimizer: Any = None) -> tuple[dict[Storage, str], dict[Storage, tuple[str, str]]]:
    """``(params, opt_state)`` for :func:`graph_from_ir` from a module and its optimizer.

    ``params[storage] = name`` (``named_parameters`` order; tied weights once);
    ``opt_state[storage] = (f"{key}:{param name}", param name)`` for every lazy tensor in
    ``optimizer.state`` (``exp_avg``, ``exp_avg_sq``, a capturable ``step``...).
    """
    params: dict[Storage, str] = {}
    name_of: dict[int, str] = {}
    for name, p in module.named_parameters():
        if not isinstance(p, LazyTensor):
            raise TypeError(f"parameter {name!r} is on {p.device}, not on the jax device; move the module first")
        params[storage_of(p)] = name
        name_of[id(p)] = name
    state: dict[Storage, tuple[str, str]] = {}
    for p, slots in (optimizer.state.items() if optimizer is not None else ()):
        pname = name_of.get(id(p))
        if pname is None:
            continue
        for key, v in slots.items():
            if isinstance(v, LazyTensor):
                state[storage_of(v)] = (f"{key}:{pname}", pname)
    return params, state


def graph_from_ir(storages: Sequence[Storage] | None = None, *, params: Mapping[Any, str],
                  opt_state: Mapping[Any, tuple[str, str] | str] | None = None,
                  inputs: Mapping[Any, str] | None = None, grads: Mapping[str, Any] | None = None,
                  name: str = "graph") -> Graph:
    """Convert the pending IR of ``storages`` (default: :func:`pending_storages`) to a Graph.

    A whole training step is pending only if ``backward()`` did not launch its forward and
    backward on their own: on a GPU or TPU, set ``xla_dtensor.config.launch_at_backward = False``
    while recording the step to convert (see ``xla_dtensor/core/phases.py``; the AUTO policy
    does this for the modules it plans).

    Args:
        params: parameter storage (or lazy tensor) -> name.
        opt_state: state storage (or tensor) -> ``(name, owning parameter name)`` or a bare
            name (then it gets its own alias group).
        inputs: batch storage (or tensor) -> name. When None every other data leaf with a
            dimension is an input ``input{i}`` in graph order; 0-dim leaves (and, when
            ``inputs`` is given, unnamed leaves) are ``"constant"`` placeholders.
        grads: parameter name -> its gradient (lazy tensor or IR node). When None the
            gradient of each parameter is found from the update: the earliest-produced
            tensor of the parameter's shape read by an in-place op of its alias group.
    """
    return _Builder(storages, params, opt_state or {}, inputs, grads, name).build()


def graph_from_ir_with_nodes(storages: Sequence[Storage] | None = None, *, params: Mapping[Any, str],
                             opt_state: Mapping[Any, tuple[str, str] | str] | None = None,
                             inputs: Mapping[Any, str] | None = None, name: str = "graph") -> tuple[Graph, dict[Ref, Node]]:
    """:func:`graph_from_ir` and, per op output ``(node id, output index)`` of the graph, the IR node holding it.

    A single-output op's output maps to the IR op node, a multi-output op's outputs to
    the IR ``getitem`` nodes that read them. Plans are read back onto the IR through this
    map (the AUTO policy's activation and gradient constraints).
    """
    b = _Builder(storages, params, opt_state or {}, inputs, None, name)
    return b.build(), b.ir_of


def _recording_order(order: list[Node]) -> list[Node]:
    """``order`` (a DFS from the roots) sorted by creation, as the step was recorded: forward, backward
    (each weight gradient next to its layer's other backward ops), optimizer. Layer clustering
    labels ops by the layer whose parameter was read last in this order. Kept as the DFS gave it
    where creation order is not topological (never expected: a node's inputs exist before it)."""
    ranked = sorted(order, key=lambda n: n.seq)
    at = {id(n): i for i, n in enumerate(ranked)}
    if all(at.get(id(x), -1) < i for i, n in enumerate(ranked) for x in n.inputs if id(x) in at):
        return ranked
    return order


def _storage(x: Any) -> Storage:
    if isinstance(x, Storage):
        return x
    if isinstance(x, LazyTensor):
        return storage_of(x)
    raise TypeError(f"expected a Storage or a lazy tensor on the jax device, got {type(x).__name__}")


def _meta(m: tuple | None) -> TensorMeta:
    if m is None:
        return TensorMeta((), "int64")
    return TensorMeta(tuple(int(s) for s in m[0]), str(m[1]).removeprefix("torch."))


def _packet(node: Node) -> str:
    return str(node.op).rsplit(".", 1)[0]


def _is_key_leaf(node: Node) -> bool:
    return node.op == DATA and node.key[2] == "key"


def _view_chain(n: Node) -> tuple:
    """A ``view_scatter``'s view chain as plain values: ``(op name, input shape, arguments)`` per step.

    A step that is not a plain op call (an output of a multi-output view) is written as
    ``("?", (), ())``, which the strategy rule reads as "keep every dim whole".
    """
    steps = []
    for key, index in n.key[1]:
        if index is not None or not (isinstance(key, tuple) and len(key) == 2 and isinstance(key[1], tuple)
                                     and key[1] and isinstance(key[1][0], tuple)):
            steps.append(("?", (), ()))
            continue
        op, args = key
        steps.append((str(op), tuple(int(d) for d in args[0][0]), tuple(_plain_key(a) for a in args[1:])))
    return tuple(steps)


def _plain_key(a: Any) -> Any:
    """A signature-key argument as a plain value (``(int, 3)`` -> ``3``)."""
    if isinstance(a, tuple) and len(a) == 2 and isinstance(a[0], type):
        return a[1]
    if isinstance(a, tuple):
        return tuple(_plain_key(b) for b in a)
    return a if a is None or isinstance(a, (bool, int, float, str)) else str(a)


def _walk_back(value: Node) -> tuple[Node, tuple[Node, int] | None]:
    """The base of a rebound storage's value and the (first in-place op, input index) reading it."""
    first = None
    v = value
    while v.fn is not None:
        if v.op == "view_scatter":
            first, v = (v, 0), v.inputs[0]
            continue
        node, out = (v.inputs[0], v.key[1]) if v.op == GETITEM else (v, 0)
        if not A.is_op(node) or not op_info(node.op).mutated:
            break
        e = A.entry(node)
        tg = A.targets(node)
        if out < e.n_ret or out - e.n_ret >= len(tg):
            break
        first, v = (node, tg[out - e.n_ret]), node.inputs[tg[out - e.n_ret]]
    return v, first


class _Builder:
    def __init__(self, storages: Sequence[Storage] | None, params: Mapping[Any, str], opt_state: Mapping,
                 inputs: Mapping[Any, str] | None, grads: Mapping[str, Any] | None, name: str) -> None:
        self.storages = list(pending_storages() if storages is None else storages)
        self.params = {_storage(k): v for k, v in params.items()}
        self.state = {_storage(k): (v, None) if isinstance(v, str) else tuple(v) for k, v in opt_state.items()}
        self.inputs = None if inputs is None else {_storage(k): v for k, v in inputs.items()}
        self.grads = grads
        self.g = Graph(name=name)
        self.env: dict[int, Any] = {}            # id(IR node) -> (nid, idx) | nid (multi-output) | [refs]
        self.redirect: dict[tuple[int, int], Ref] = {}   # (id(consumer), input index) -> placeholder
        self.group_of: dict[int, int] = {}
        self.groups: list[list[int]] = []
        self.ir_of: dict[Ref, Node] = {}          # graph op output -> the IR node holding it

    # -- placeholders ---------------------------------------------------------------------------
    def _placeholders(self) -> list[Node]:
        g, groups_by_param = self.g, {}
        tracked = [(s, n, "param", n) for s, n in self.params.items()]
        tracked += [(s, n, "opt_state", p) for s, (n, p) in self.state.items()]
        for s, label, role, owner in tracked:
            base, first = _walk_back(s.value)
            if base.op == DATA and id(base) in self.env:
                continue  # the same leaf already named (never expected: one storage per leaf)
            meta = _meta(s.meta[:2])
            if base.op == DATA:
                nid = g.add("placeholder", (), (meta,), role=role, name=label)
                self.env[id(base)] = (nid, 0)
            elif first is not None and _packet(base) in _FRESH:
                nid = g.add("placeholder", (), (meta,), role=role, name=label)
                self.redirect[(id(first[0]), first[1])] = (nid, 0)
            else:
                continue
            key = owner if owner is not None else f"\0{label}"
            if key not in groups_by_param:
                groups_by_param[key] = len(self.groups)
                self.groups.append([])
            self.groups[groups_by_param[key]].append(nid)
            self.group_of[nid] = groups_by_param[key]
        order = self._order()
        for n in order:
            if n.op == DATA and id(n) not in self.env and not _is_key_leaf(n):
                self._leaf(n)
        return order

    def _leaf(self, n: Node) -> None:
        meta = _meta(A.out_metas(n)[0])
        label = None if self.inputs is None else next((v for s, v in self.inputs.items() if s.value is n), None)
        k = sum(1 for x in self.g.nodes if x.role in ("input", "constant"))
        if label is not None or (self.inputs is None and meta.ndim > 0):
            role, label = "input", label or f"input{sum(1 for x in self.g.nodes if x.role == 'input')}"
        else:
            role, label = "constant", f"constant{k}"
        self.env[id(n)] = (self.g.add("placeholder", (), (meta,), role=role, name=label), 0)

    def _edges(self, n: Node) -> list[Node]:
        return [x for i, x in enumerate(n.inputs)
                if (id(n), i) not in self.redirect and x.op != PARAM and not _is_key_leaf(x)]

    def _order(self) -> list[Node]:
        seen: set[int] = set()
        order: list[Node] = []
        for root in [s.value for s in self.storages]:
            if id(root) in seen:
                continue
            seen.add(id(root))
            stack = [(root, iter(self._edges(root)))]
            while stack:
                node, it = stack[-1]
                nxt = next((x for x in it if id(x) not in seen), None)
                if nxt is None:
                    stack.pop()
                    order.append(node)
                else:
                    seen.add(id(nxt))
                    stack.append((nxt, iter(self._edges(nxt))))
        return _recording_order(order)

    # -- ops ------------------------------------------------------------------------------------
    def _ref(self, consumer: Node, i: int) -> Ref:
        r = self.redirect.get((id(consumer), i))
        if r is not None:
            return r
        v = self.env[id(consumer.inputs[i])]
        return v[0] if isinstance(v, list) else (v, 0) if isinstance(v, int) else v

    def _tensor_inputs(self, n: Node, item: int | None = None) -> list[tuple[int, Ref]]:
        return [(i, self._ref(n, i)) for i, s in enumerate(A.layout(n))
                if s.kind in (A.TENSOR, A.CPU0) and (item is None or s.item is None or s.item == item)]

    def _new_version(self, old: Ref, new: Ref) -> None:
        k = self.group_of.get(old[0])
        if k is not None and new[0] not in self.group_of:
            self.groups[k].append(new[0])
            self.group_of[new[0]] = k

    def _convert(self, n: Node) -> None:
        if n.op == GETITEM:
            v, i = self.env[id(n.inputs[0])], n.key[1]
            ref = self.env[id(n)] = v[i] if isinstance(v, list) else (v, i) if isinstance(v, int) else (v[0], i)
            self.ir_of.setdefault(ref, n)
        elif n.op == "convert":
            src, shape = self._ref(n, 0), tuple(n.key[3])
            op, args = ("aten._to_copy.default", (None,)) if tuple(n.key[1]) == shape else \
                ("aten.expand.default", (None, shape))
            nid = self.g.add(op, (src,), (_meta((shape, n.key[4])),), args)
            self.env[id(n)] = (nid, 0)
            self.ir_of[(nid, 0)] = n
        elif n.op == "view_scatter":
            old = self._ref(n, 0)
            nid = self.g.add("view_scatter", (old, self._ref(n, 1)), (_meta(A.out_metas(n)[0]),), _view_chain(n))
            self._new_version(old, (nid, 0))
            self.env[id(n)] = (nid, 0)
        elif str(n.op).startswith("aten._foreach_"):
            self._foreach(n)
        elif str(n.op).startswith(FUSED_STEPS):
            self._fused_step(n)
        else:
            self._op(n)

    def _op(self, n: Node) -> None:
        ins = self._tensor_inputs(n)
        metas = tuple(_meta(m) for m in A.out_metas(n))
        nid = self.g.add(str(n.op), tuple(r for _, r in ins), metas, A.plain_args(n))
        self.env[id(n)] = (nid, 0) if len(metas) == 1 else nid
        if len(metas) == 1:
            self.ir_of[(nid, 0)] = n
        if op_info(n.op).mutated:
            n_ret = A.entry(n).n_ret
            for j, t in enumerate(A.targets(n)):
                self._new_version(self._ref(n, t), (nid, n_ret + j))

    def _foreach(self, n: Node) -> None:
        slots, metas = A.layout(n), A.out_metas(n)
        count = max((s.item for s in slots if s.item is not None), default=-1) + 1
        mutated = set(A.targets(n)) if op_info(n.op).mutated else set()
        refs = []
        for k in range(count):
            ins = self._tensor_inputs(n, k)
            nid = self.g.add(str(n.op), tuple(r for _, r in ins), (_meta(metas[k]),), A.plain_args(n, k),
                             name=f"{n.op}[{k}]")
            refs.append((nid, 0))
            for i, r in ins:
                if i in mutated and slots[i].item == k:
                    self._new_version(r, (nid, 0))
        self.env[id(n)] = refs

    def _fused_step(self, n: Node) -> None:
        """A fused optimizer step: one node per updated tensor, over its parameter's slice of the lists.

        Output ``j`` updates the tensor at input ``targets[j]``; its node reads that tensor
        first (the foreach rule follows the first operand), then the other tensors of the
        same list index and the shared scalars (``grad_scale``). A target the step leaves
        unchanged (gradients without ``grad_scale``) keeps its old reference.
        """
        slots, metas, kept, args = A.layout(n), A.out_metas(n), A.entry(n).kept, A.plain_args(n)
        refs = []
        for j, t in enumerate(A.targets(n)):
            old = self._ref(n, t)
            if j in kept:
                refs.append(old)
                continue
            k = slots[t].item
            ins = [old] + [r for i, r in self._tensor_inputs(n, k) if i != t]
            nid = self.g.add(str(n.op), tuple(ins), (_meta(metas[j]),), args, name=f"{n.op}[{j}]")
            refs.append((nid, 0))
            self._new_version(old, (nid, 0))
        self.env[id(n)] = refs

    # -- roles ----------------------------------------------------------------------------------
    def _grad_refs(self) -> dict[int, Ref]:
        g, out = self.g, {}
        by_name = {n.name: n.id for n in g.nodes if n.role == "param"}
        if self.grads is not None:
            for pname, t in self.grads.items():
                node = value_of(t) if isinstance(t, LazyTensor) else t
                if pname in by_name and id(node) in self.env:
                    v = self.env[id(node)]
                    out[by_name[pname]] = v[0] if isinstance(v, list) else (v, 0) if isinstance(v, int) else v
            return out
        for pid in by_name.values():
            grp = self.groups[self.group_of[pid]]
            members, shape = set(grp), g.nodes[pid].out.shape
            cands = [r for v in grp if g.nodes[v].op != "placeholder" for r in g.nodes[v].inputs
                     if r[0] not in members and g.nodes[r[0]].outputs[r[1]].shape == shape
                     and g.nodes[r[0]].op != "placeholder"]
            if cands:
                out[pid] = min(cands)
        return out

    def build(self) -> Graph:
        from dataclasses import replace

        for n in self._placeholders():
            if n.op not in (DATA, PARAM):
                self._convert(n)
        g = self.g
        g.grads = self._grad_refs()
        for gid, _ in g.grads.values():
            if g.nodes[gid].role == "op":
                g.nodes[gid] = replace(g.nodes[gid], role="grad")
        grads = set(g.grads.values())
        outs = []
        for s in self.storages:
            v = self.env.get(id(s.value))
            ref = v[0] if isinstance(v, list) else (v, 0) if isinstance(v, int) else v
            if ref is not None and ref not in grads and ref not in outs:
                outs.append(ref)
        g.outputs = outs
        g.alias_groups = self.groups
        return g
