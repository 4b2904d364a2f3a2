"""Layer clustering (after Alpa): find a model's identical blocks, keep three, weight the middle one.

A transformer's training step repeats one block per layer in the forward, the backward
and the optimizer update. :func:`find_layers` labels every node with its layer: a
parameter by the number in its name (``model.layers.7.mlp.up_proj.weight``), an
optimizer element by the parameter it updates, any other op by the layer whose
parameter was read last in execution order (so a "layer" may start a few ops late; it
does so in every layer alike). It then checks node by node that the layers are copies
of a representative (same op, shapes, arguments; inputs at the same position in the
same or an adjacent layer, or the very same outside node) and keeps the longest run
``a..b`` of such interior layers; the first and last layers, which read from the
embedding or feed the head, usually differ and stay as they are.

:func:`reduce_graph` keeps layers ``a``, ``a+1`` and ``b`` and drops ``a+2..b-1``,
rewiring the kept nodes that read them to the matching node of the adjacent kept layer.
Layer ``a+1`` then stands for ``w = b-a-1`` layers (``weight``). With the three tied to
one strategy (as the full problem ties its identical layers), weighting costs by the
consumer's weight gives exactly the full problem's objective; memory is exact for
tensors live across layers (parameters, optimizer state, gradients, saved activations:
weight ``w``) and for a layer's transients (weight 1), approximate only inside the
middle layer's own backward, where its saved tensors are freed while its gradients
appear. Problem size and solve time then no longer grow with depth.

Example:
    >>> import torch
    >>> from autoshard.models import GPT2, GPT2Config
    >>> from autoshard.fx_builder import trace_training_step
    >>> with torch.device("meta"):
    ...     model = GPT2(GPT2Config(vocab=96, n_positions=16, n_embd=32, n_layer=6, n_head=2))
    >>> g = trace_training_step(model, (torch.zeros(2, 16, dtype=torch.long, device="meta"),) * 2)
    >>> layers = find_layers(g)
    >>> layers.num_layers, (layers.first, layers.last)
    (6, (1, 4))
    >>> red = reduce_graph(g, layers)
    >>> red.graph.num_nodes < g.num_nodes, red.width
    (True, 2)
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from autoshard.graph import Graph, _plain

_INDEX = re.compile(r"^(.*?)\.(\d+)\.")
_DIGITS = re.compile(r"\d+")


@dataclass
class Layers:
    """Layer label per node, the nodes of each layer in order, and the interior run ``first..last``."""

    label: list[int]                 # per node: layer index, -1 outside every layer
    members: list[list[int]]         # per layer: its nodes in execution order
    first: int                       # interior run of identical layers: first..last
    last: int
    prefix: str = ""                 # the module list's name (``model.layers``)

    @property
    def num_layers(self) -> int:
        return len(self.members)


@dataclass
class Reduced:
    """The graph with layers ``first+2..last-1`` dropped; ``middle`` stands for ``width`` layers."""

    graph: Graph
    layers: Layers
    of_full: list[int]               # full node -> reduced node (a dropped layer's node -> the middle one's)
    weight: list[int]                # per reduced node: how many full layers it stands for
    middle: list[int]                # reduced ids of the middle layer's nodes
    triples: list[tuple[int, int, int]] = field(default_factory=list)  # (a, a+1, b) copies of one node
    width: int = 1

    @property
    def kept_layers(self) -> tuple[int, int, int]:
        return self.layers.first, self.layers.first + 1, self.layers.last


def _owner(name: str) -> str:
    return name.split(":", 1)[-1]  # exp_avg:<param> belongs to <param>


def _module_list(graph: Graph) -> tuple[str, dict[int, int]] | None:
    """The repeated module list's prefix and each placeholder's layer, or None."""
    counts: Counter[str] = Counter()
    for n in graph.nodes:
        if n.op == "placeholder" and n.role == "param" and (m := _INDEX.match(_owner(n.name))):
            counts[m.group(1)] += 1
    best = None
    for prefix, _ in counts.most_common():
        idx = {int(_INDEX.match(_owner(n.name)).group(2)) for n in graph.nodes  # type: ignore[union-attr]
               if n.op == "placeholder" and _INDEX.match(_owner(n.name)) and _INDEX.match(_owner(n.name)).group(1) == prefix}
        if idx == set(range(len(idx))) and len(idx) >= 2 and (best is None or len(idx) > best[1]):
            best = (prefix, len(idx))
    if best is None:
        return None
    layer_of = {}
    for n in graph.nodes:
        if n.op == "placeholder" and (m := _INDEX.match(_owner(n.name))) and m.group(1) == best[0]:
            layer_of[n.id] = int(m.group(2))
    return best[0], layer_of


def _labels(graph: Graph, layer_of: dict[int, int]) -> list[int]:
    label = [-1] * graph.num_nodes
    for v, k in layer_of.items():
        label[v] = k
    for grp in graph.alias_groups:
        k = label[grp[0]]
        for v in grp:
            if graph.nodes[v].op == "placeholder":
                k = max(k, label[v])
    current = -1
    for n in graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op.startswith("aten._foreach"):  # an optimizer element belongs to the tensor it updates
            label[n.id] = label[n.inputs[0][0]] if n.inputs else -1
            continue
        read = [label[s] for s, _ in n.inputs if graph.nodes[s].op == "placeholder" and graph.nodes[s].role != "input"]
        if read:
            current = max(read)
        label[n.id] = current
    return label


def find_layers(graph: Graph) -> Layers | None:
    """Label the layers of ``graph`` and find its run of identical interior layers (None: none)."""
    found = _module_list(graph)
    if found is None:
        return None
    prefix, layer_of = found
    label, members, a, b = _run(graph, _labels(graph, layer_of), max(layer_of.values()) + 1)
    return Layers(label, members, a, b, prefix)


def _run(graph: Graph, label: list[int], n_layers: int) -> tuple[list[int], list[list[int]], int, int]:
    """The layers' members and the longest run of copies of the middle layer around it."""
    members: list[list[int]] = [[] for _ in range(n_layers)]
    for v, k in enumerate(label):
        if k >= 0:
            members[k].append(v)
    pos = [0] * graph.num_nodes
    for mem in members:
        for i, v in enumerate(mem):
            pos[v] = i
    r = n_layers // 2
    same = [k == r or _copies(graph, label, pos, members, k, r) for k in range(n_layers)]
    a = b = r
    while a - 1 >= 0 and same[a - 1]:
        a -= 1
    while b + 1 < n_layers and same[b + 1]:
        b += 1
    return label, members, a, b


def _copies(graph: Graph, label: list[int], pos: list[int], members: list[list[int]], k: int, r: int) -> bool:
    """Whether layer ``k`` is a node-by-node copy of layer ``r``."""
    if len(members[k]) != len(members[r]):
        return False
    nodes = graph.nodes
    for v, w in zip(members[k], members[r]):
        x, y = nodes[v], nodes[w]
        if (x.op, x.outputs, x.role, len(x.inputs)) != (y.op, y.outputs, y.role, len(y.inputs)):
            return False
        if x.op == "placeholder":
            if _DIGITS.sub("#", x.name) != _DIGITS.sub("#", y.name):
                return False
        elif _plain(x.args) != _plain(y.args):
            return False
        for (s, i), (t, j) in zip(x.inputs, y.inputs):
            if i != j:
                return False
            ls, lt = label[s], label[t]
            if ls < 0 or lt < 0:
                if s != t:
                    return False
            elif ls - k != lt - r or abs(ls - k) > 1 or pos[s] != pos[t]:
                return False
    return True


def reduce_graph(graph: Graph, layers: Layers) -> Reduced:
    """Drop layers ``first+2..last-1`` (see module docstring); raises ValueError if the run is under 3 layers."""
    a, b = layers.first, layers.last
    if b - a + 1 < 3:
        raise ValueError(f"layer clustering needs at least 3 identical layers, found {b - a + 1} ({a}..{b})")
    label, members = layers.label, layers.members
    pos = {v: i for mem in members for i, v in enumerate(mem)}
    dropped = [a + 2 <= label[v] <= b - 1 for v in range(graph.num_nodes)]
    slot = {a: 0, a + 1: 1, b: 2}
    kept_layer = (a, a + 1, b)
    new_id: dict[int, int] = {}
    red = Graph(name=f"{graph.name}/clustered")

    def target(v: int, src: int) -> int:
        """The reduced node that kept node ``v`` reads for ``src`` (an adjacent kept layer's copy if dropped)."""
        if not dropped[src]:
            return new_id[src]
        lv = label[v]
        if lv not in slot or abs(label[src] - lv) != 1:
            raise ValueError(f"node {graph.nodes[v].name} (layer {lv}) reads {graph.nodes[src].name} of dropped layer "
                             f"{label[src]}; only the adjacent kept layers may")
        k = kept_layer[slot[lv] + label[src] - lv]
        if members[k][pos[src]] not in new_id:
            raise ValueError(f"node {graph.nodes[v].name} would read a later node of layer {k}: the layers interleave")
        return new_id[members[k][pos[src]]]

    for n in graph.nodes:
        if dropped[n.id]:
            continue
        inputs = tuple((target(n.id, s), i) for s, i in n.inputs)
        new_id[n.id] = red.add(n.op, inputs, n.outputs, n.args, n.role, n.name)
    red.outputs = [(new_id[v], i) for v, i in graph.outputs if not dropped[v]]
    red.grads = {new_id[p]: (target(p, v), i) for p, (v, i) in graph.grads.items() if not dropped[p]}
    red.alias_groups = [[new_id[v] for v in grp if not dropped[v]] for grp in graph.alias_groups]
    red.alias_groups = [grp for grp in red.alias_groups if grp]
    width = b - a - 1
    weight = [1] * red.num_nodes
    middle = [new_id[v] for v in members[a + 1]]
    for v in middle:
        weight[v] = width
    of_full = [new_id[members[a + 1][pos[v]]] if dropped[v] else new_id[v] for v in range(graph.num_nodes)]
    triples = [(new_id[x], new_id[y], new_id[z]) for x, y, z in zip(members[a], members[a + 1], members[b])]
    return Reduced(red, layers, of_full, weight, middle, triples, width)
