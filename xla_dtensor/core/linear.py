"""``F.linear`` on our device: one recorded op (``xla_dtensor::linear``), not four.

``aten::linear`` is a composite op: for an input of rank 3 torch records ``t``, ``view``,
``addmm`` and ``view`` (2.8 of a transformer forward's every 4.1 recorded ops are views and
transposes around matmuls). This module registers an ``AutogradPrivateUse1`` kernel that
records :data:`xla_dtensor.ops.fused_linear.LINEAR` instead; its backward is one op too
(``LINEAR_BACKWARD``), or torch ops where a graph of the gradient is wanted (double
backward) or only some inputs need a gradient. It takes lazy tensors (``LazyTensor`` and
its subclasses: ``XLAShardedTensor``, what AUTO and FSDP make parameters) of one floating
dtype, an input of rank >= 2 and matching shapes; anything else (torch's DTensor over
lazy tensors, fake tensors, a 1-D input, shapes torch rejects) and
``config.fused_linear = False`` take torch's decomposition, with its errors.

Example:
    >>> import torch, xla_dtensor
    >>> lin = torch.nn.Linear(4, 2).to(xla_dtensor.device())
    >>> lin(torch.ones(3, 5, 4, device=xla_dtensor.device())).shape
    torch.Size([3, 5, 2])
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core.tensor import SUBCLASSES, LazyTensor, call_op
from xla_dtensor.ops.fused_linear import LINEAR, LINEAR_BACKWARD

aten = torch.ops.aten
_LIB = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (kept alive: the registration lives with it)


class _Linear(torch.autograd.Function):
    """``xla_dtensor::linear`` with torch ops as its gradient."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, b: Any) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        return call_op(LINEAR, x, w, b)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        x, w = ctx.saved_tensors
        need = ctx.needs_input_grad
        if all(need[:2]) and (need[2] or not ctx.has_bias) and not torch.is_grad_enabled() and _lazy(grad) \
                and grad.dtype == x.dtype and config.fused_linear:
            # one recorded op; torch ops below when a graph of the gradient is wanted (double backward)
            metrics.incr("fused_linear_backward")
            grads = call_op(LINEAR_BACKWARD, grad, x, w, ctx.has_bias)
            return grads[0], grads[1], grads[2] if ctx.has_bias else None
        gx = grad @ w if ctx.needs_input_grad[0] else None
        flat = grad.reshape(-1, grad.shape[-1])
        gw = flat.t() @ x.reshape(-1, x.shape[-1]) if ctx.needs_input_grad[1] else None
        gb = flat.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gx, gw, gb


def _lazy(t: Any) -> bool:
    return type(t) is LazyTensor or type(t) in SUBCLASSES


def fusable(x: Any, w: Any, b: Any) -> bool:
    """Whether ``xla_dtensor::linear`` computes exactly this ``F.linear`` call.

    Example:
        >>> import torch
        >>> fusable(torch.ones(2, 3), torch.ones(4, 3), None)  # CPU tensors: torch's own kernel
        False
    """
    if not (config.fused_linear and _lazy(x) and _lazy(w)):
        return False
    (xs, xd, _), (ws, wd, _) = x._meta, w._meta  # NOTE: not .shape / .dim(): each a call into torch
    if b is not None and (not _lazy(b) or b._meta[1] is not xd or b._meta[0] != ws[:1]):
        return False
    return len(xs) >= 2 and len(ws) == 2 and xs[-1] == ws[1] and xd is wd and xd.is_floating_point


def _route(x: Any, w: Any, b: Any = None) -> Any:
    if not fusable(x, w, b):
        return aten.linear.default.decompose(x, w, b)
    metrics.incr("fused_linear")
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad or (b is not None and b.requires_grad)):
        if _functorch_active():
            return _Linear.apply(x, w, b)
        return _APPLY(x, w, b)  # NOTE: torch's C entry, without Function.apply's Python (functorch's wrappers)
    with torch._C._AutoDispatchBelowAutograd():
        return call_op(LINEAR, x, w, b)


_APPLY = super(torch.autograd.Function, _Linear).apply  # what Function.apply calls without functorch
_functorch_active = torch._C._are_functorch_transforms_active


def _install() -> str:
    """Put F.linear's kernel at ``AutogradPrivateUse1``: with the C recorder, the core's C++ one
    (``_cxx.install_linear``: the same decisions, with a C++ autograd node, handing every other call to
    :func:`_route`), else :func:`_route`; which one ("cxx" or "python")."""
    from xla_dtensor.core import native
    cxx = None
    if native.ON:  # (the C++ kernel enters the C recorder; the Python recorder's path keeps the Python route)
        from xla_dtensor.core import cxx
    if cxx is None or cxx.MODULE is None:
        _LIB.impl("linear", _route, "AutogradPrivateUse1")
        return "python"
    cxx.MODULE.install_linear(_route, LINEAR, LINEAR_BACKWARD, metrics._COUNTS, config, _functorch_active)
    return "cxx"


KERNEL = _install()
