"""Small helpers shared by the family modules."""
from __future__ import annotations

import math

from autoshard.graph import Graph, Node, TensorMeta


def dims(prefix: str, n: int) -> tuple[str, ...]:
    """Fresh labels ``prefix0 .. prefix{n-1}``."""
    return tuple(f"{prefix}{i}" for i in range(n))


def ins(node: Node, graph: Graph) -> list[TensorMeta]:
    return [node.input_meta(graph, i) for i in range(len(node.inputs))]


def broadcast_labels(meta: TensorMeta, out: TensorMeta) -> tuple[str | None, ...]:
    """Labels of an input broadcast (right-aligned) against ``out``: size-1 dims get ``None``."""
    off = out.ndim - meta.ndim
    return tuple(None if s == 1 and out.shape[off + i] != 1 else f"d{off + i}"
                 for i, s in enumerate(meta.shape))


def deepest(node: Node, graph: Graph) -> int:
    """The input an elementwise op follows: most elements, then the latest producer."""
    metas = ins(node, graph)
    return max(range(len(metas)), key=lambda i: (metas[i].numel, node.inputs[i][0]))


def norm_dim(d: int, ndim: int) -> int:
    return d + ndim if d < 0 else d


def numel(meta: TensorMeta) -> int:
    return math.prod(meta.shape)
