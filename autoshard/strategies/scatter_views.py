"""Writes through a view: ``slice_scatter`` / ``select_scatter`` and the lazy core's ``view_scatter``.

The result is the base with the view's region replaced by the source: dims the view
keeps one-to-one follow the base, the sliced (or selected) dims stay whole. The lazy
core records ``x[..., 1:] = y`` (T5 shifts its decoder inputs so) as one
``view_scatter`` node whose arguments list the view chain, ``(op, input shape,
arguments)`` per step (:mod:`xla_dtensor.auto.ir_graph`); the chain's view rules map the
base's dims onto the source's, and a dim any step does not carry stays whole. A chain
with a step no view rule describes leaves every dim whole.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node, TensorMeta
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import lookup, register


def _base_and_src(node: Node, graph: Graph, base: tuple, src: tuple) -> DimRule:
    return DimRule((base, src), (base,), follower=True, flops=float(node.input_meta(graph, 1).numel))


@register("aten.slice_scatter")
def slice_scatter(node: Node, graph: Graph) -> DimRule:
    """(base, src, dim=0, start, end, step): the sliced dim whole unless the slice covers it."""
    x, src = ins(node, graph)[:2]
    dim = norm_dim(node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0, x.ndim)
    labels = tuple(None if d == dim and x.shape[d] != src.shape[d] else l for d, l in enumerate(dims("d", x.ndim)))
    return _base_and_src(node, graph, labels, labels)


@register("aten.select_scatter")
def select_scatter(node: Node, graph: Graph) -> DimRule:
    """(base, src, dim, index): ``src`` lacks ``dim``."""
    x = ins(node, graph)[0]
    dim = norm_dim(node.args[2], x.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", x.ndim)))
    return _base_and_src(node, graph, labels, labels[:dim] + labels[dim + 1:])


@register("view_scatter")
def view_scatter(node: Node, graph: Graph) -> DimRule:
    """(base, src) with ``args`` = the view chain from base to the region ``src`` replaces."""
    base, src = ins(node, graph)[:2]
    labels = view_chain_labels(base, node.args)
    if labels is None or len(labels[1]) != src.ndim:
        return _base_and_src(node, graph, (None,) * base.ndim, (None,) * src.ndim)
    return _base_and_src(node, graph, *labels)


def view_chain_labels(base: TensorMeta, chain: tuple) -> tuple[tuple, tuple] | None:
    """Labels of ``base`` and of the view ``chain`` makes of it, or None if a step is not understood.

    A base dim keeps its label only if every step carries it to the view one-to-one.
    """
    cur: list = list(dims("d", base.ndim))
    shape = base.shape
    carried = set(cur)
    for step in chain:
        if not (isinstance(step, tuple) and len(step) == 3):
            return None
        op, in_shape, args = step
        out_shape = _view_shape(op, tuple(in_shape), tuple(args))
        fn = lookup(op)
        if fn is None or out_shape is None or tuple(in_shape) != tuple(shape):
            return None
        g = Graph()
        x = g.add("placeholder", (), (TensorMeta(tuple(in_shape)),), role="input", name="x")
        v = g.add(op, ((x, 0),), (TensorMeta(out_shape),), (None,) + tuple(args))
        try:
            rule = fn(g.nodes[v], g)
        except (IndexError, TypeError, ValueError, KeyError):
            return None
        if rule is None or len(rule.inputs[0]) != len(cur):
            return None
        by_label = {l: cur[d] for d, l in enumerate(rule.inputs[0]) if l is not None}
        carried &= {cur[d] for d, l in enumerate(rule.inputs[0]) if l is not None} | {None}
        cur, shape = [by_label.get(l) if l is not None else None for l in rule.outputs[0]], out_shape
    base_labels = tuple(l if l in carried else None for l in dims("d", base.ndim))
    return base_labels, tuple(l if l in carried else None for l in cur)


def _view_shape(op: str, shape: tuple[int, ...], args: tuple) -> tuple[int, ...] | None:
    """The output shape of the view ops a write-through chain holds (slice, select, transpose...)."""
    packet = op.rsplit(".", 1)[0]
    try:
        if packet in ("aten.slice", "aten.narrow"):
            dim = norm_dim(args[0] if args else 0, len(shape))
            if packet == "aten.narrow":
                start, length = args[1], args[2]
                return shape[:dim] + (length,) + shape[dim + 1:]
            start = args[1] if len(args) > 1 and args[1] is not None else 0
            end = args[2] if len(args) > 2 and args[2] is not None else shape[dim]
            step = args[3] if len(args) > 3 else 1
            start, end = _clip(start, shape[dim]), _clip(end, shape[dim])
            return shape[:dim] + (max(0, -(-(end - start) // step)),) + shape[dim + 1:]
        if packet == "aten.select":
            dim = norm_dim(args[0], len(shape))
            return shape[:dim] + shape[dim + 1:]
        if packet in ("aten.t", "aten.transpose"):
            d0, d1 = (args[0], args[1]) if packet == "aten.transpose" else (0, 1)
            out = list(shape)
            if len(shape) >= 2:
                d0, d1 = norm_dim(d0, len(shape)), norm_dim(d1, len(shape))
                out[d0], out[d1] = out[d1], out[d0]
            return tuple(out)
        if packet == "aten.permute":
            return tuple(shape[norm_dim(d, len(shape))] for d in args[0])
        if packet == "aten.unsqueeze":
            d = norm_dim(args[0], len(shape) + 1)
            return shape[:d] + (1,) + shape[d:]
    except (IndexError, TypeError):
        return None
    return None


def _clip(i: int, n: int) -> int:
    return max(0, min(n, i + n if i < 0 else i))
