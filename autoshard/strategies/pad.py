"""``constant_pad_nd``: padded dims stay whole, the others follow the input.

HF's causal-LM loss shifts the labels with ``F.pad(labels, (0, 1), value=-100)``: the
batch dim keeps its split, so data parallelism survives the loss. Padding with zeros is
linear (a ``Partial`` input stays ``Partial``); with another value it is not.

Example:
    >>> from autoshard.graph import Graph, TensorMeta
    >>> g = Graph()
    >>> x = g.add("placeholder", (), (TensorMeta((8, 16), "int64"),), role="input", name="labels")
    >>> v = g.add("aten.constant_pad_nd.default", ((x, 0),), (TensorMeta((8, 17), "int64"),), (None, (0, 1), -100))
    >>> constant_pad_nd(g.nodes[v], g).inputs
    (('d0', None),)
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.constant_pad_nd")
def constant_pad_nd(node: Node, graph: Graph) -> DimRule:
    """(x, pad, value=0): ``pad`` lists (before, after) pairs from the last dim backwards."""
    (x,) = ins(node, graph)[:1]
    pad = tuple(node.args[1]) if len(node.args) > 1 and node.args[1] is not None else ()
    padded = {x.ndim - 1 - i // 2 for i, p in enumerate(pad) if p != 0}
    labels = tuple(None if d in padded else l for d, l in enumerate(dims("d", x.ndim)))
    value = node.args[2] if len(node.args) > 2 else 0
    return DimRule((labels,), (labels,), linear=value in (0, 0.0, None), follower=True,
                   flops=float(node.outputs[0].numel))
