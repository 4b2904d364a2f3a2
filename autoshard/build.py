"""Graph + topology -> the strategy :class:`Problem`, with the ties that keep it small.

Every node gets its rule's strategies (leaders enumerate, followers mirror the node
they follow), a cost vector (roofline compute), a memory vector (local output bytes;
views and in-place ops allocate nothing) and one edge per producer -> consumer pair
whose matrix is the resharding cost. ``ties`` groups the nodes that must pick the
same strategy index: followers with their leader, aliases (parameter, optimizer state
and their in-place updates), and identical repeated layers (:mod:`autoshard.tying`).

Example:
    >>> from mesh import Mesh, topology_for
    >>> from autoshard.graph import Graph, TensorMeta
    >>> g = Graph()
    >>> x = g.add("placeholder", (), (TensorMeta((8, 4)),), role="input", name="x")
    >>> w = g.add("placeholder", (), (TensorMeta((4, 2)),), role="param", name="w")
    >>> _ = g.add("aten.mm.default", ((x, 0), (w, 0)), (TensorMeta((8, 2)),))
    >>> m = build_model(g, topology_for(Mesh(range(2), (2,), ("d",)), "cpu"))
    >>> [s.name for s in m.strategies[2]]
    ['R', 'm', 'k', 'n']
"""
from __future__ import annotations

import warnings
from collections import defaultdict
from functools import lru_cache
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import numpy as np
from mesh import Topology

from autoshard.cost import combined_collectives, compute_cost, memory_bytes, reshard_cost
from autoshard.graph import Graph, Node
from autoshard.solver.problem import Problem
from autoshard.spec import Spec, spec_str
from autoshard.strategies import DimRule, Strategy, enumerate_strategies, follow_strategies
from autoshard.strategies.base import check_rule
from autoshard.strategies.generic import opaque_rule, resolve
from autoshard.tying import UnionFind, layer_ties


class UnknownOpWarning(UserWarning):
    """An op has no strategy rule and no generic one fits: it runs whole on every device (its inputs are gathered)."""


class RuleFailedWarning(UnknownOpWarning):
    """An op's rule does not fit the node (a rule bug or an unexpected call form): it is planned as opaque."""


class PinError(ValueError):
    """A pinned placement names no placeholder of the graph or is not one of its strategies."""


@dataclass
class Model:
    """The built problem plus what is needed to read a solution back."""

    graph: Graph
    topology: Topology
    rules: list[DimRule]
    strategies: list[list[Strategy]]
    follows: list[int | None]  # per graph node; problem nodes past the graph are reshard fan-outs
    problem: Problem
    ties: list[list[int]]
    unknown_ops: list[str] = field(default_factory=list)
    generic_ops: dict[str, str] = field(default_factory=dict)  # op -> generic kind (strategies.generic)
    untied_groups: int = 0  # decision groups after follower/alias merging, before layer tying
    fanouts: list[tuple[int, int]] = field(default_factory=list)  # problem node num_nodes + k reshards fanouts[k]

    def group_of(self) -> list[int]:
        """Index into :attr:`ties` for every node."""
        out = [0] * self.graph.num_nodes
        for k, grp in enumerate(self.ties):
            for v in grp:
                out[v] = k
        return out


def _SOURCE(meta) -> DimRule:  # noqa: N802
    return DimRule((), (tuple(f"d{i}" for i in range(meta.ndim)),))


def _allocates(node: Node, rule: DimRule) -> bool:
    packet = node.op.split(".")[1] if node.op.startswith("aten.") else node.op
    if packet.endswith("_"):
        return False  # in-place: writes into the tensor it mutates
    return not (rule.follower and rule.linear and rule.flops == 0.0)  # views alias their input


def _elementwise(op: str) -> bool:
    """Whether ``op`` is an elementwise (or optimizer foreach) op, which XLA fuses."""
    from autoshard.strategies.elementwise import LINEAR, NONLINEAR, SUM
    from autoshard.strategies.optimizer import FOREACH, SINGLE

    parts = op.split(".")
    return any(".".join(parts[:k]) in (*LINEAR, *NONLINEAR, *SUM, *FOREACH, *SINGLE) for k in (2, 3))


def _edge_matrix(src: list, dst: list, meta, topo: Topology, unread: bool = False) -> np.ndarray:
    """Resharding costs ``[p, q]``, computed once per distinct (source, target) spec pair (zero if unread)."""
    if unread:
        return np.zeros((len(src), len(dst)))
    us, ui = _unique(src)
    vs, vi = _unique(dst)
    return _small_matrix(tuple(us), tuple(vs), meta.nbytes, topo)[np.ix_(ui, vi)]


@lru_cache(maxsize=1 << 14)
def _small_matrix(us: tuple, vs: tuple, nbytes: int, topo: Topology) -> np.ndarray:
    """Costs between distinct specs; shared by every edge with the same spec lists and size (read-only)."""
    from autoshard.graph import TensorMeta

    meta = TensorMeta((nbytes,), "uint8")
    out = np.array([[reshard_cost(a, b, meta, topo) for b in vs] for a in us])
    out.flags.writeable = False
    return out


def _unique(specs: list) -> tuple[list, np.ndarray]:
    index: dict = {}
    ids = np.array([index.setdefault(s, len(index)) for s in specs], dtype=np.int64)
    return list(index), ids


def node_strategies(graph: Graph, topo: Topology, generic: dict[str, str] | None = None,
                    ) -> tuple[list[DimRule], list[list[Strategy]], list[int | None], list[str]]:
    """Rules, strategies and followed node for every node, in execution order.

    An op without a registered rule gets a generic one (:mod:`autoshard.strategies.generic`;
    ``generic[op]`` records which kind); a rule that fails on its node (wrong ranks, an
    unexpected call form) is replaced by the opaque rule with a :class:`RuleFailedWarning`.
    Opaque ops are listed in the returned ``unknown`` and warned about once per op.
    """
    sizes = topo.axis_sizes
    rules, strats, follows, unknown = [], [], [], []
    failed: dict[str, str] = {}
    generic = {} if generic is None else generic
    for node in graph.nodes:
        in_metas = tuple(node.input_meta(graph, i) for i in range(len(node.inputs)))
        try:
            rule, ss, u = _strategies_of(node, graph, in_metas, strats, sizes, generic)
        except Exception as err:  # noqa: BLE001  NOTE: no op graph may crash the planner; warned below
            failed.setdefault(node.op, f"{type(err).__name__}: {err}")
            rule, u = opaque_rule(node, graph), None
            ss = enumerate_strategies(rule, in_metas, node.outputs, sizes)
        if generic.get(node.op) == "opaque" or node.op in failed:
            unknown.append(node.op)
        strats.append(ss)
        follows.append(u)
        rules.append(rule)
    for op, why in sorted(failed.items()):
        warnings.warn(f"the sharding rule of op {op!r} does not fit its node ({why}); planning it as an opaque "
                      f"op (run whole on every device, inputs gathered)", RuleFailedWarning, stacklevel=3)
    for op in sorted({op for op in unknown if op not in failed}):
        warnings.warn(f"no sharding strategy rule for op {op!r} and no generic one fits; it runs whole on every "
                      f"device (inputs gathered, outputs sliced for free)", UnknownOpWarning, stacklevel=3)
    return rules, strats, follows, unknown


def _strategies_of(node: Node, graph: Graph, in_metas: tuple, strats: list[list[Strategy]], sizes: tuple[int, ...],
                   generic: dict[str, str]) -> tuple[DimRule, list[Strategy], int | None]:
    """A node's rule, its strategies and the node it follows (None for a leader)."""
    rule, kind = resolve(node, graph)
    if kind != "registered":
        generic[node.op] = kind
    check_rule(rule, in_metas, node.outputs)
    if rule.follower and node.inputs:
        rule = _flexible_leader(rule, node, strats)
        u, idx = node.inputs[rule.leader]
        leader_specs = [s.out_specs[idx] for s in strats[u]]
        return rule, follow_strategies(rule, leader_specs, in_metas, node.outputs, sizes), u
    return rule, enumerate_strategies(rule, in_metas, node.outputs, sizes), None


def _pin(graph: Graph, strats: list[list[Strategy]], costs: list[np.ndarray],
         pinned: Mapping[str, Spec]) -> Graph:
    """Forbid (inf cost) every other strategy of each pinned placeholder; the graph layer tying sees.

    A pinned placeholder's name carries its pin in the returned graph, so layer tying
    only ties it to layers pinned the same way (an unpinned twin layer stays free).
    """
    by_name = {n.name: n.id for n in graph.nodes if n.op == "placeholder"}
    nodes = list(graph.nodes)
    for name, spec in pinned.items():
        v = by_name.get(name)
        if v is None:
            raise PinError(f"pinned tensor {name!r} is not a placeholder of the graph; placeholders: "
                           f"{sorted(by_name)[:12]}{'...' if len(by_name) > 12 else ''}")
        spec = tuple(spec)
        allowed = [s.out_specs[0] for s in strats[v]]
        if spec not in allowed:
            raise PinError(f"pinned placement {spec_str(spec)} of {name!r} (shape {graph.nodes[v].out.shape}) "
                           f"is not one of its strategies: {[spec_str(a) for a in allowed]}")
        costs[v] = np.where([a == spec for a in allowed], costs[v], np.inf)
        nodes[v] = replace(nodes[v], name=f"{nodes[v].name}|pin={spec_str(spec)}")
    return replace(graph, nodes=nodes)


def build_model(graph: Graph, topo: Topology, memory_limit: float | None = None, *,
                tie_layers: bool = True, pinned: Mapping[str, Spec] | None = None) -> Model:
    """Build the full (untied) :class:`Problem` for ``graph`` on ``topo`` and its tie groups.

    ``pinned[name] = spec`` fixes placeholder ``name`` (a parameter, optimizer state or
    input) to ``spec``; its alias group follows. Raises :class:`PinError` on a bad pin.
    """
    generic: dict[str, str] = {}
    rules, strats, follows, unknown = node_strategies(graph, topo, generic)
    sizes = topo.axis_sizes
    costs, mems = [], []
    for node, rule, ss in zip(graph.nodes, rules, strats):
        in_metas = tuple(node.input_meta(graph, i) for i in range(len(node.inputs)))
        if node.role == "input":  # feeding the batch: each device loads its shard
            costs.append(np.array([topo.compute_time(0.0, memory_bytes(s.out_specs, node.outputs, sizes)) for s in ss]))
        else:
            fused = _elementwise(node.op) or generic.get(node.op) == "pointwise"  # XLA fuses it into its neighbours
            costs.append(np.array([compute_cost(s, rule.flops, in_metas, node.outputs, topo, fused)
                                   + _internal_cost(rule, s, topo) for s in ss]))
        alloc = _allocates(node, rule)
        mems.append(np.array([memory_bytes(s.out_specs, node.outputs, sizes) if alloc else 0.0 for s in ss]))
    consumers: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
    for node in graph.nodes:
        for i, ref in enumerate(node.inputs):
            consumers[ref].append((node.id, i))
    fanouts = [ref for ref, cs in consumers.items()
               if graph.nodes[ref[0]].op != "placeholder" and len({v for v, _ in cs}) > 1]
    fan_of = {ref: graph.num_nodes + k for k, ref in enumerate(fanouts)}
    for u, idx in fanouts:  # one reshard per tensor, shared by all its readers
        meta = graph.nodes[u].outputs[idx]
        specs = [s.out_specs[0] for s in enumerate_strategies(_SOURCE(meta), (), (meta,), sizes)]
        strats.append([Strategy(spec_str(sp), (sp,), (sp,)) for sp in specs])
        costs.append(np.zeros(len(specs)))
        mems.append(np.zeros(len(specs)))
    tie_graph = _pin(graph, strats, costs, pinned) if pinned else graph
    pair: dict[tuple[int, int], np.ndarray] = {}
    grads, combined = set(graph.grads.values()), combined_collectives(topo)

    def link_model(ref: tuple[int, int]) -> Topology:
        return combined if ref in grads else topo

    def add_edge(u: int, v: int, mat: np.ndarray) -> None:
        pair[(u, v)] = pair[(u, v)] + mat if (u, v) in pair else mat

    for (u, idx), f in fan_of.items():
        add_edge(u, f, _edge_matrix([s.out_specs[idx] for s in strats[u]], [s.in_specs[0] for s in strats[f]],
                                    graph.nodes[u].outputs[idx], link_model((u, idx))))
    for node in graph.nodes:
        v = node.id
        for i, (u, idx) in enumerate(node.inputs):
            src, j = (fan_of[(u, idx)], 0) if (u, idx) in fan_of else (u, idx)
            add_edge(src, v, _edge_matrix([s.out_specs[j] for s in strats[src]], [s.in_specs[i] for s in strats[v]],
                                          graph.nodes[u].outputs[idx], link_model((u, idx)), i in rules[v].unread))
    names = [n.name for n in graph.nodes] + [f"reshard({graph.nodes[u].name}:{idx})" for u, idx in fanouts]
    intervals = graph.liveness() + [(0, 0)] * len(fanouts)
    problem = Problem(graph.name, costs, mems, intervals, list(pair), list(pair.values()), memory_limit, names)
    uf = UnionFind(len(costs))
    for v, u in enumerate(follows):
        if u is not None:
            uf.union(u, v)
    for grp in graph.alias_groups:
        for v in grp[1:]:
            if len(strats[v]) == len(strats[grp[0]]):
                uf.union(grp[0], v)
    untied_groups = len(uf.groups())
    if tie_layers:
        layer_ties(tie_graph, uf, [len(s) for s in strats])
        by_key: dict[tuple, int] = {}
        for (u, idx), f in fan_of.items():
            key = (uf.find(u), idx, len(strats[f]), tuple(sorted({uf.find(v) for v, _ in consumers[(u, idx)]})))
            if key in by_key:
                uf.union(by_key[key], f)
            else:
                by_key[key] = f
    return Model(graph, topo, rules, strats, follows, problem, uf.groups(), unknown, generic, untied_groups,
                 list(fanouts))


def _flexible_leader(rule: DimRule, node: Node, strats: list[list[Strategy]]) -> DimRule:
    """Among inputs labelled like the leader (a residual ``add``'s two operands), follow the freest one.

    A follower has exactly the splits of the input it follows; following one whose
    producer cannot split the batch (an MoE combine that gathers its rows) would keep the
    whole rest of the block replicated, while its twin operand can split. In-place and
    optimizer ops keep their leader: they must follow the tensor they update, which
    shares their alias group's tie.
    """
    packet = node.op.split(".")[1] if node.op.startswith("aten.") else node.op
    if packet.endswith("_") or packet.startswith(("_foreach", "_fused")):
        return rule
    labels = rule.inputs[rule.leader]

    def freedom(i: int) -> tuple[int, bool]:
        u, idx = node.inputs[i]
        return len({s.out_specs[idx] for s in strats[u]}), i == rule.leader

    same = [i for i, lab in enumerate(rule.inputs) if lab == labels and i < len(node.inputs)]
    best = max(same, key=freedom)
    return rule if best == rule.leader else replace(rule, leader=best)


def _internal_cost(rule: DimRule, strategy: Strategy, topo: Topology) -> float:
    """The op's own all-reduce (batch norm statistics over a split batch), if the strategy needs it."""
    if not strategy.reduce_axes or rule.internal_bytes <= 0:
        return 0.0
    return topo.collective("all_reduce", rule.internal_bytes, strategy.reduce_axes)
