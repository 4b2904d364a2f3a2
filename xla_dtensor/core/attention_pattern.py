"""The hand-written attention pattern on our device: one fused attention op, as SDPA is.

``softmax(q @ k.transpose(-2, -1) * scale + masks, dim=-1) @ v`` is recorded by the ops it
is written with: two matmuls around a ``T x T`` score matrix, forward and backward. This
module registers an ``AutogradPrivateUse1`` kernel for ``aten::matmul`` (a composite op,
like SDPA) that, in lazy tracing and ``xla_dtensor.compile``, recognizes the pattern where
its second matmul is called and returns the fused op (:func:`xla_dtensor.core.sdpa.fused`)
instead; the output's autograd graph then goes to ``q``, ``k`` and ``v`` directly, and the
recorded score/softmax nodes are never lowered unless the user keeps the probabilities.

* A batched ``a @ b`` (both operands on our device, of the same rank >= 3) remembers its
  operands and its output's ``grad_fn`` under the output's IR node (a weak table: an entry
  lives as long as the node is pending).
* ``p @ v`` is fused when ``p``'s IR value is ``softmax(x, -1)`` (casts between float types
  around it allowed) and ``x`` is, from a remembered ``q @ kt``: scaling by Python numbers
  or constant 0-d tensors (``mul``/``div``), then any of ``masked_fill(mask, v)`` and
  ``where(mask, x, v)`` / ``where(mask, v, x)`` with ``v`` -inf or at most the dtype's
  ``finfo.min``, and ``+ bias`` (a float tensor); the probabilities, ``q``, ``k`` and ``v``
  of one dtype, shapes the fused op takes (:func:`~xla_dtensor.core.sdpa.fusable`).
  Where ``p`` needs a gradient, its ``grad_fn`` chain must reach the product's along one
  path (so no mask or scale needs a gradient, and the gradient goes where torch sends it).
* Everything else (a scale after a mask, softmax over another dim, dropout with ``p > 0``
  in training, eager mode, ``config.fused_attention = False``): torch's decomposition.
  Any other matmul pays the Python kernel call and a type and rank check: ~3.5 us a call
  on the development machine (a recorded 2-D matmul: 10.6 -> 14.2 us).

NOTE: a mask or bias is taken as the IR value it had; the fused op's scale is a static
float, so a scale read from a Python number is baked into the program like SDPA's.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor import metrics
    >>> q = torch.randn(1, 2, 4, 8, device=xla_dtensor.device())
    >>> before = metrics.counters()["fused_attention"]
    >>> out = torch.softmax(q @ q.transpose(-2, -1) * 0.35, dim=-1) @ q
    >>> metrics.counters()["fused_attention"] - before
    1
"""
from __future__ import annotations

import weakref
from typing import Any

import torch

from xla_dtensor.config import config
from xla_dtensor.core.ir import Node
from xla_dtensor.core.sdpa import fusable, fused
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, new_tensor, value_of

aten = torch.ops.aten
_OP_DK, _COMPOSITE = aten.matmul.default._op_dk, torch._C.DispatchKey.CompositeImplicitAutograd
_LIB = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (kept alive: the registration lives with it)
_SOFTMAX, _CONVERT, _FILL = aten._softmax.default, "convert", aten.fill_.Scalar
_SCALE_OPS = {aten.mul.Tensor: False, aten.mul_.Tensor: False, aten.div.Tensor: True, aten.div_.Tensor: True}
_MASKED_FILL = frozenset({aten.masked_fill.Scalar, aten.masked_fill_.Scalar, aten.masked_fill.Tensor,
                          aten.masked_fill_.Tensor})
_ADD = frozenset({aten.add.Tensor, aten.add_.Tensor})
_GRAD_SLACK = 4  # autograd nodes with no IR node of their own (a same-dtype ``_to_copy``) allowed on the path


class _Product:
    """A batched ``a @ b``: its operands, its output's ``grad_fn`` and shape."""

    __slots__ = ("a", "b", "grad_fn", "shape")

    def __init__(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        self.a, self.b, self.grad_fn, self.shape = a, b, out.grad_fn, tuple(out.shape)


# NOTE: keyed by the product's IR node. An entry reaches only the product's inputs (its operands and the
# backward graph behind its grad_fn), never the node itself, so it dies with the node: when the
# scores and everything recorded from them are dead, or the pending graph has run.
_PRODUCTS: weakref.WeakKeyDictionary[Node, _Product] = weakref.WeakKeyDictionary()


class _Found:
    """What the chain from a product to the softmax input computes."""

    __slots__ = ("product", "scale", "masks", "biases", "steps")

    def __init__(self, product: _Product) -> None:
        self.product, self.scale, self.steps = product, 1.0, 0
        self.masks: list[tuple[Node, tuple, bool]] = []  # (node, meta, True where the mask marks the hole)
        self.biases: list[tuple[Node, tuple]] = []


def _matmul(a: Any, b: Any) -> Any:
    if (isinstance(a, LazyTensor) and isinstance(b, LazyTensor) and a.dim() == b.dim() and a.dim() >= 3
            and config.fused_attention and not STATE.runs_at_once()):
        out = _fused(a, b)
        if out is None:
            out = _OP_DK(_COMPOSITE, a, b)
            if isinstance(out, LazyTensor):
                _PRODUCTS[value_of(out)] = _Product(a, b, out)
        return out
    return _OP_DK(_COMPOSITE, a, b)  # NOTE: not ``OpOverload.decompose``, which costs ~15 us more a call


def _is_meta(e: Any) -> bool:
    return type(e) is tuple and len(e) == 3 and isinstance(e[1], torch.dtype)


def _operands(node: Node) -> list | None:
    """The node's positional arguments: a tensor as ``(meta, node)``, a number as its value.

    ``None`` for a call with keyword arguments or a CPU 0-d tensor (not read here).
    """
    inputs, out = iter(node.inputs), []
    for e in node.key[1]:
        if _is_meta(e):
            out.append((e, next(inputs)))
        elif type(e) is tuple and len(e) == 2 and e[0] == "P":
            out.append(next(inputs).data)
        elif type(e) is tuple and len(e) == 2 and isinstance(e[0], type):
            out.append(e[1])
        else:
            return None
    return out


def _constant(arg: Any) -> float | None:
    """A number, or the value of a 0-d tensor filled with a constant (``torch.full([], v)``), as torch holds it."""
    if type(arg) in (int, float):
        return float(arg)
    if type(arg) is not tuple or arg[0][0] != () or arg[1].op is not _FILL:
        return None
    args = _operands(arg[1])
    if args is None or type(args[1]) not in (int, float):
        return None
    return torch.tensor(args[1], dtype=arg[0][1]).item()  # rounded to the tensor's dtype, as torch computes


def _is_hole(value: float | None, dtype: torch.dtype) -> bool:
    """Whether a fill value masks a score out: -inf, or at most the dtype's ``finfo.min``."""
    return value is not None and dtype.is_floating_point and value <= torch.finfo(dtype).min


def _walk(node: Node, below_scale: bool) -> _Found | None:
    """The chain from a remembered product up to ``node`` (the softmax input), or ``None``."""
    product = _PRODUCTS.get(node)
    if product is not None:
        return _Found(product)
    op, found = node.op, None
    if op == _CONVERT:
        _, src_shape, src_dtype, shape, dtype = node.key
        if src_shape == shape and src_dtype.is_floating_point and dtype.is_floating_point:
            found = _walk(node.inputs[0], below_scale)
    elif op in _SCALE_OPS:
        found = _scaled(node, _SCALE_OPS[op])
    elif below_scale:  # a mask or bias before the scale: the fused op scales first
        return None
    elif op in _MASKED_FILL:
        args = _operands(node)
        if args is not None and len(args) == 3 and _is_hole(_constant(args[2]), args[0][0][1]):
            found = _walk(args[0][1], False)
            if found is not None:
                found.masks.append((args[1][1], args[1][0], True))
    elif op is aten.where.self:
        found = _where(node)
    elif op in _ADD:
        found = _added(node)
    if found is not None:
        found.steps += 1
    return found


def _scaled(node: Node, divide: bool) -> _Found | None:
    args = _operands(node)
    if args is None or len(args) != 2:
        return None
    for main, factor in ((args[0], args[1]),) if divide else ((args[0], args[1]), (args[1], args[0])):
        c = _constant(factor)
        if type(main) is not tuple or c is None:
            continue
        if divide and c == 0:
            return None
        found = _walk(main[1], True)
        if found is not None:
            found.scale = found.scale / c if divide else found.scale * c
        return found
    return None


def _where(node: Node) -> _Found | None:
    args = _operands(node)
    if args is None or len(args) != 3 or args[0][0][1] != torch.bool:
        return None
    cond, x, y = args
    for main, filler, cond_marks_hole in ((x, y, False), (y, x, True)):
        if _is_hole(_constant(filler), main[0][1]):
            found = _walk(main[1], False)
            if found is not None:
                found.masks.append((cond[1], cond[0], cond_marks_hole))
            return found
    return None


def _added(node: Node) -> _Found | None:
    args = _operands(node)
    if args is None or len(args) != 2 or not all(type(a) is tuple for a in args):
        return None
    for main, bias in ((args[0], args[1]), (args[1], args[0])):
        if bias[0][1].is_floating_point:
            found = _walk(main[1], False)
            if found is not None:
                found.biases.append((bias[1], bias[0]))
                return found
    return None


def _probabilities(node: Node, ndim: int) -> _Found | None:
    """The chain below ``softmax(x, -1)`` at ``node`` (casts on top allowed), or ``None``."""
    casts = 0
    while node.op == _CONVERT and casts < 2:
        node, casts = node.inputs[0], casts + 1
    if node.op is not _SOFTMAX:
        return None
    _, (meta, dim, half_to_float) = node.key
    if half_to_float or dim not in ((int, -1), (int, ndim - 1)):
        return None
    found = _walk(node.inputs[0], False)
    if found is not None:
        found.steps += 1 + casts
    return found


def _grad_reaches(fn: Any, target: Any, limit: int) -> bool:
    """Whether the gradient from ``fn`` flows along one path only, to ``target``."""
    if fn is None or target is None:
        return False
    for _ in range(limit):
        if fn is target:
            return True
        nxt = [f for f, _ in fn.next_functions if f is not None]
        if len(nxt) != 1:
            return False
        fn = nxt[0]
    return fn is target


def _combined(parts: list[torch.Tensor], op: Any) -> torch.Tensor | None:
    out = None
    for p in parts:
        out = p if out is None else op(out, p)
    return out


def _fused(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor | None:
    """``xla_dtensor::attention`` computing ``p @ v``, or ``None`` where ``p`` is not the pattern's."""
    node = value_of(p)
    if node.op is not _SOFTMAX and node.op != _CONVERT:
        return None
    found = _probabilities(node, p.dim())
    if found is None:
        return None
    product = found.product
    q, kt = product.a, product.b
    if tuple(p.shape) != product.shape or not p.dtype == q.dtype == kt.dtype == v.dtype:
        return None
    k = kt.transpose(-2, -1)
    masks = [new_tensor(meta, m) for m, meta, _ in found.masks]
    mask = _combined([torch.logical_not(m) if hole else m for m, (_, _, hole) in zip(masks, found.masks)],
                     torch.logical_and)
    bias = _combined([new_tensor(meta, b) for b, meta in found.biases], torch.add)
    if bias is not None and bias.dtype != q.dtype:
        bias = bias.to(q.dtype)
    # NOTE: enable_gqa: matmul broadcast a single key/value head over the query heads (else it raised)
    if not (fusable(q, k, v, mask, 0.0, False, True) and fusable(q, k, v, bias, 0.0, False, True)):
        return None
    if torch.is_grad_enabled() and p.requires_grad:
        if not _grad_reaches(p.grad_fn, product.grad_fn, found.steps + _GRAD_SLACK):
            return None
    else:  # no gradient reaches q or k through p: the remembered operands may be other tensors of the same value
        q, k = q.detach(), k.detach()
    return fused(q, k, v, mask, bias, False, found.scale)


_LIB.impl("matmul", _matmul, "AutogradPrivateUse1")
