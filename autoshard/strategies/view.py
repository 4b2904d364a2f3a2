"""Shape ops: view / reshape, transpose / permute / t, expand, (un)squeeze, slice, select,
view_as_complex / view_as_real.

All follow their input through the dim map and pass Partial values through. For a
reshape, dims are grouped into runs of equal element count; only the first
(non-unit) dim of each run on both sides shares a label, so a split survives exactly
when it lands on a group's leading dim and divides it.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


def _follow(in_labels: tuple, out_labels: tuple, node: Node) -> DimRule:
    return DimRule((in_labels,), (out_labels,), linear=True, follower=True, flops=0.0)


def reshape_labels(src: tuple[int, ...], dst: tuple[int, ...]) -> tuple[tuple, tuple]:
    """Labels for a reshape from ``src`` to ``dst`` (see module docstring)."""
    a_lab: list = [None] * len(src)
    b_lab: list = [None] * len(dst)
    i = j = 0
    group = 0
    while i < len(src) or j < len(dst):
        gi, gj = [i], [j]
        pa = src[i] if i < len(src) else 1
        pb = dst[j] if j < len(dst) else 1
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(src):
                pa *= src[i]
                gi.append(i)
                i += 1
            elif j < len(dst):
                pb *= dst[j]
                gj.append(j)
                j += 1
            else:
                break
        first_a = next((k for k in gi if k < len(src) and src[k] != 1), None)
        first_b = next((k for k in gj if k < len(dst) and dst[k] != 1), None)
        if first_a is not None and first_b is not None:
            a_lab[first_a] = b_lab[first_b] = f"g{group}"
        group += 1
    return tuple(a_lab), tuple(b_lab)


@register("aten.view", "aten._unsafe_view", "aten.reshape", "aten.view.default", "aten._reshape_alias",
          "aten.flatten", "aten.unflatten", "aten.unsqueeze", "aten.squeeze")
def view(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    a, b = reshape_labels(x.shape, node.outputs[0].shape)
    return _follow(a, b, node)


@register("aten.t", "aten.transpose", "aten.permute", "aten.numpy_T")
def permute(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    labels = dims("d", x.ndim)
    if node.op.startswith("aten.permute"):
        order = [norm_dim(d, x.ndim) for d in node.args[1]]
    else:
        d0, d1 = (node.args[1], node.args[2]) if node.op.startswith("aten.transpose") else (0, 1)
        order = list(range(x.ndim))
        if x.ndim >= 2:
            d0, d1 = norm_dim(d0, x.ndim), norm_dim(d1, x.ndim)
            order[d0], order[d1] = order[d1], order[d0]
    return _follow(labels, tuple(labels[k] for k in order), node)


@register("aten.expand")
def expand(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    out = node.outputs[0]
    out_labels = dims("d", out.ndim)
    off = out.ndim - x.ndim
    in_labels = tuple(None if s == 1 and out.shape[off + i] != 1 else out_labels[off + i]
                      for i, s in enumerate(x.shape))
    return _follow(in_labels, out_labels, node)


@register("aten.slice.Tensor", "aten.narrow")
def slice_(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    dim = norm_dim(node.args[1] if len(node.args) > 1 else 0, x.ndim)
    labels = tuple(None if d == dim and x.shape[d] != node.outputs[0].shape[d] else l
                   for d, l in enumerate(dims("d", x.ndim)))
    return _follow(labels, labels, node)


@register("aten.select.int")
def select(node: Node, graph: Graph) -> DimRule:
    (x,) = ins(node, graph)[:1]
    dim = norm_dim(node.args[1], x.ndim)
    labels = tuple(None if d == dim else l for d, l in enumerate(dims("d", x.ndim)))
    return _follow(labels, labels[:dim] + labels[dim + 1:], node)


@register("aten.view_as_complex")
def view_as_complex(node: Node, graph: Graph) -> DimRule:
    """``(..., 2)`` real -> ``(...)`` complex: the trailing (real, imag) pair stays whole, the rest map 1:1."""
    (x,) = ins(node, graph)[:1]
    labels = dims("d", x.ndim - 1)
    return _follow(labels + (None,), labels, node)


@register("aten.view_as_real")
def view_as_real(node: Node, graph: Graph) -> DimRule:
    """``(...)`` complex -> ``(..., 2)`` real: every dim maps 1:1, the new trailing pair is whole."""
    (x,) = ins(node, graph)[:1]
    labels = dims("d", x.ndim)
    return _follow(labels, labels + (None,), node)
