"""The op graph autoshard plans over: framework-neutral, one node per op.

A :class:`Node` is an op (an aten op name string such as ``"aten.mm.default"``, or a
role marker ``"placeholder"`` for parameters, inputs and optimizer state) with its
tensor inputs (``(producer node id, output index)`` pairs), the non-tensor arguments,
and its output tensors (:class:`TensorMeta`). Nodes are stored in execution order, so
a node's id is also its position in the schedule that liveness is measured on.
Builders: :mod:`autoshard.fx_builder` (aten FX graphs from ``make_fx``); the lazy
core's IR will feed the same structure.

Example:
    >>> g = Graph()
    >>> x = g.add("placeholder", (), (TensorMeta((8, 4), "float32"),), role="input", name="x")
    >>> w = g.add("placeholder", (), (TensorMeta((4, 2), "float32"),), role="param", name="w")
    >>> y = g.add("aten.mm.default", ((x, 0), (w, 0)), (TensorMeta((8, 2), "float32"),))
    >>> g.liveness()[x], g.num_nodes
    ((0, 3), 3)
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Literal

Role = Literal["op", "param", "input", "opt_state", "grad", "constant", "output"]
ROLES: tuple[str, ...] = ("op", "param", "input", "opt_state", "grad", "constant", "output")

_ITEMSIZE = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4,
             "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    """Shape and dtype of one tensor (dtype as a plain string such as ``"float32"``)."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE.get(self.dtype, 4)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass(frozen=True, slots=True)
class Node:
    """One op. ``inputs[i] = (producer id, producer output index)`` for tensor input i."""

    id: int
    op: str
    inputs: tuple[tuple[int, int], ...]
    outputs: tuple[TensorMeta, ...]
    args: tuple[Any, ...] = ()
    role: str = "op"
    name: str = ""

    @property
    def out(self) -> TensorMeta:
        """The first output (most ops have exactly one)."""
        return self.outputs[0]

    def input_meta(self, graph: Graph, i: int) -> TensorMeta:
        src, idx = self.inputs[i]
        return graph.nodes[src].outputs[idx]


@dataclass
class Graph:
    """Nodes in execution order plus alias groups (param <-> grad <-> optimizer state).

    ``alias_groups`` lists node ids that hold the same logical tensor (a parameter, its
    optimizer state and their in-place updates): they must share a sharding.
    ``grads[param id] = (node id, output index)`` of the gradient the optimizer reads.
    """

    nodes: list[Node] = field(default_factory=list)
    alias_groups: list[list[int]] = field(default_factory=list)
    grads: dict[int, tuple[int, int]] = field(default_factory=dict)
    outputs: list[tuple[int, int]] = field(default_factory=list)
    name: str = "graph"

    def add(self, op: str, inputs: tuple[tuple[int, int], ...], outputs: tuple[TensorMeta, ...],
            args: tuple[Any, ...] = (), role: str = "op", name: str = "") -> int:
        """Append a node and return its id; inputs must name earlier nodes."""
        nid = len(self.nodes)
        for src, idx in inputs:
            if not (0 <= src < nid and 0 <= idx < len(self.nodes[src].outputs)):
                raise ValueError(f"node {nid} ({op}) input ({src}, {idx}) does not name an earlier "
                                 f"node output; graph has {nid} nodes")
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; allowed: {list(ROLES)}")
        self.nodes.append(Node(nid, op, tuple(inputs), tuple(outputs), tuple(args), role, name or f"{op}#{nid}"))
        return nid

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    def users(self) -> list[list[int]]:
        """``users()[v]`` = ids of the nodes reading an output of ``v`` (with repeats removed)."""
        out: list[list[int]] = [[] for _ in self.nodes]
        for n in self.nodes:
            for src in dict.fromkeys(s for s, _ in n.inputs):
                out[src].append(n.id)
        return out

    def liveness(self) -> list[tuple[int, int]]:
        """Half-open interval ``[start, end)`` in schedule steps during which a node's outputs live.

        Parameters, optimizer state and graph outputs live for the whole step; other
        tensors from their producer to their last reader.
        """
        n = self.num_nodes
        last = list(range(1, n + 1))
        for node in self.nodes:
            for src, _ in node.inputs:
                last[src] = max(last[src], node.id + 1)
        whole = {v for group in self.alias_groups for v in group}
        whole |= {v for v, _ in self.outputs}
        whole |= {node.id for node in self.nodes if node.role in ("param", "opt_state")}
        return [(0, n) if v in whole else (v, last[v]) for v in range(n)]

    def param_ids(self) -> list[int]:
        return [n.id for n in self.nodes if n.role == "param"]

    def fingerprint(self) -> str:
        """Stable hash of ops, shapes, dtypes, args, roles, names and aliasing (the cache key)."""
        h = hashlib.sha256()
        for n in self.nodes:
            h.update(repr((n.op, n.inputs, [(o.shape, o.dtype) for o in n.outputs],
                           _plain(n.args), n.role, n.name)).encode())
        h.update(repr((self.alias_groups, sorted(self.grads.items()), self.outputs)).encode())
        return h.hexdigest()[:16]


def _plain(args: Any) -> Any:
    if isinstance(args, (list, tuple)):
        return tuple(_plain(a) for a in args)
    if isinstance(args, (int, float, str, bool)) or args is None:
        return args
    return str(args)
