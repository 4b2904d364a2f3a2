"""The rule of an op no family registers, from what its shapes and torch's op tags say.

Tried in order, the first that applies wins (:func:`generic_rule` names which):

1. ``inplace``: ``aten.X_.ov`` and ``aten.X_copy.ov`` take the rule of ``aten.X.ov`` (or of the
   packet ``aten.X``); every ``aten._foreach_*`` op the foreach rule (per list element).
2. ``pointwise``: torch tags the op (or, for an in-place ``X_``, its functional form)
   ``pointwise``: the elementwise rule (broadcasting, follows its deepest operand).
3. ``same-shape``: an aten op whose every output has the shape of its largest input, the
   other inputs broadcasting to it: the op follows that input dim for dim, except the
   dims its integer arguments name (a scan's or a sort's ``dim``) and, for matrix
   functions (``linalg_*``, ``cholesky``...), the last two dims, which stay whole.
   Ops outside ``aten`` (custom kernels) are not assumed to map dims one-to-one.
4. ``source``: no tensor inputs: every output may be produced in any layout (sliced from
   a whole result, so the work is not divided).
5. ``opaque``: the op runs whole on every device; its inputs are gathered (priced on
   their edges) and its outputs may be handed on sliced for free, so one opaque op costs
   its own resharding and never forces its producers or consumers to replicate.

Example:
    >>> from autoshard.graph import Graph, TensorMeta
    >>> g = Graph()
    >>> x = g.add("placeholder", (), (TensorMeta((8, 4)),), role="input", name="x")
    >>> v = g.add("aten.logit.default", ((x, 0),), (TensorMeta((8, 4)),))
    >>> rule, kind = generic_rule(g.nodes[v], g)
    >>> kind, rule.inputs
    ('pointwise', (('d0', 'd1'),))
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

from autoshard.graph import Graph, Node
from autoshard.strategies._util import broadcast_labels, dims, ins, norm_dim
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import lookup, rule_for

KINDS = ("inplace", "pointwise", "same-shape", "source", "opaque")
_MATRIX = ("linalg", "cholesky", "inverse", "lu", "triangular_solve", "matrix_exp", "slogdet", "det", "qr", "svd",
           "eig", "pinverse", "solve")


def resolve(node: Node, graph: Graph) -> tuple[DimRule, str]:
    """The node's registered rule (kind ``"registered"``) or else its generic one and kind."""
    rule = rule_for(node, graph)
    return (rule, "registered") if rule is not None else generic_rule(node, graph)


def generic_rule(node: Node, graph: Graph) -> tuple[DimRule, str]:
    """The rule for an op without a registered one, and which of :data:`KINDS` made it."""
    functional = _functional(node.op)
    if node.op.startswith("aten._foreach_"):
        from autoshard.strategies.optimizer import foreach

        return foreach(node, graph), "inplace"
    if functional is not None:
        rule = lookup(functional)(node, graph)
        if rule is not None:
            return rule, "inplace"
    metas = ins(node, graph)
    if not metas:
        return DimRule((), tuple(dims("d", o.ndim) for o in node.outputs), whole_compute=True), "source"
    if is_pointwise(node.op) and _broadcasts(node, graph):
        from autoshard.strategies.elementwise import elementwise_rule

        return elementwise_rule(node, graph), "pointwise"
    lead = max(range(len(metas)), key=lambda i: (metas[i].numel, -i))
    shape = metas[lead].shape
    if _overload(node.op) is not None and node.outputs and all(o.shape == shape for o in node.outputs) \
            and _broadcasts(node, graph, shape):
        whole = _named_dims(node.args, len(shape))
        if node.op.split(".")[1].lstrip("_").startswith(_MATRIX):
            whole |= set(range(max(0, len(shape) - 2), len(shape)))
        labels = tuple(None if d in whole else l for d, l in enumerate(dims("d", len(shape))))
        out = node.outputs[0]
        in_labels = tuple(tuple(None if l is None or (m.ndim == len(shape) and d in whole) else l
                                for d, l in enumerate(broadcast_labels(m, out))) for m in metas)
        return DimRule(in_labels, tuple(labels for _ in node.outputs), follower=True, leader=lead,
                       flops=float(out.numel) * len(metas)), "same-shape"
    return opaque_rule(node, graph), "opaque"


def opaque_rule(node: Node, graph: Graph) -> DimRule:
    """Inputs whole, outputs whole or sliced for free, the work done whole on every device."""
    in_labels = tuple(tuple(None for _ in m.shape) for m in ins(node, graph))
    out_labels = tuple(tuple(f"o{j}_{d}" for d in range(o.ndim)) for j, o in enumerate(node.outputs))
    return DimRule(in_labels, out_labels, whole_compute=True, flops=float(sum(o.numel for o in node.outputs)))


def _functional(op: str) -> str | None:
    """``aten.X.ov`` for an in-place ``aten.X_.ov`` or a copying ``aten.X_copy.ov`` whose plain form has a rule."""
    parts = op.split(".")
    if len(parts) < 2 or parts[0] != "aten" or parts[1].startswith("_foreach"):
        return None
    for suffix in ("_copy", "_"):
        if parts[1].endswith(suffix) and len(parts[1]) > len(suffix):
            name = ".".join([parts[0], parts[1][:-len(suffix)], *parts[2:]])
            if lookup(name) is not None:
                return name
    return None


@lru_cache(maxsize=None)
def is_pointwise(op: str) -> bool:
    """Whether torch tags aten op ``op`` (``"aten.X.ov"``; an in-place ``X_``: its functional form) pointwise."""
    import torch

    parts = op.split(".")
    names = [op] + ([".".join([parts[0], parts[1][:-1], *parts[2:]])] if len(parts) == 3 and parts[1].endswith("_")
                    else [])
    return any(o is not None and torch.Tag.pointwise in o.tags for o in map(_overload, names))


def _overload(op: str) -> Any:
    parts = op.split(".")
    if len(parts) != 3 or parts[0] != "aten":
        return None
    try:
        import torch

        return getattr(getattr(torch.ops.aten, parts[1]), parts[2])
    except (AttributeError, RuntimeError, ImportError):
        return None


def _broadcasts(node: Node, graph: Graph, shape: tuple[int, ...] | None = None) -> bool:
    """Whether every input broadcasts (right-aligned) to ``shape`` (default: the first output's)."""
    if shape is None:
        if not node.outputs:
            return False
        shape = node.outputs[0].shape
    for m in ins(node, graph):
        if m.ndim > len(shape):
            return False
        off = len(shape) - m.ndim
        if any(s != 1 and s != shape[off + i] for i, s in enumerate(m.shape)):
            return False
    return True


def _named_dims(args: tuple, ndim: int) -> set[int]:
    """Dims of an ``ndim``-d tensor that an op's integer arguments (at any nesting) may name."""
    out: set[int] = set()

    def visit(a: Any) -> None:
        if isinstance(a, bool):
            return
        if isinstance(a, int):
            if -ndim <= a < ndim:
                out.add(norm_dim(a, ndim))
        elif isinstance(a, (tuple, list)):
            for b in a:
                visit(b)

    visit(args)
    return out
