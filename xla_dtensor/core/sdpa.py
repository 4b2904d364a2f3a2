"""``F.scaled_dot_product_attention`` on our device: one fused attention op, not ~20 primitives.

``aten::scaled_dot_product_attention`` is a composite op: for a PrivateUse1 tensor torch
never asks the backend which fused kernel to use (a C++ dispatch stub) and decomposes it
into ~20 primitive ops forward and as many backward, which XLA runs as separate
matmul/softmax/matmul kernels. This module registers an ``AutogradPrivateUse1`` kernel
that routes the call instead:

* lazy tracing and ``xla_dtensor.compile``: to ``xla_dtensor::attention`` and its backward
  op (:mod:`xla_dtensor.ops.fused_attention`: cuDNN flash attention on GPU, Pallas on TPU,
  XLA's math on CPU), counted in ``metrics.counters()["fused_attention"]``; causal,
  boolean or additive masks, grouped-query attention; dropout 0 only.
* eager mode: the fused op torch CPU would pick (CPU's own ``_fused_sdp_choice``, asked
  once per input metadata), so each direction is one executable call.
* otherwise (dropout, a mask that needs a gradient, shapes the fused op does not take,
  ``config.fused_attention = False``): torch's composite decomposition.

Example:
    >>> import torch, xla_dtensor
    >>> q = torch.randn(1, 2, 4, 8, device=xla_dtensor.device())
    >>> torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    torch.Size([1, 2, 4, 8])
"""
from __future__ import annotations

import math
from typing import Any

import torch

from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core.device import platform
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, call_op
from xla_dtensor.ops.fused_attention import ATTENTION, ATTENTION_BACKWARD, refusal, warn_once

aten = torch.ops.aten
_FLASH = 1  # torch's SDPBackend.flash_attention as _fused_sdp_choice returns it
_CHOICE: dict[tuple, int] = {}  # (q, k, v metadata, is_causal, scale, flash enabled) -> CPU's choice
_LIB = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (kept alive: the registration lives with it)


def _cpu_choice(q: LazyTensor, k: LazyTensor, v: LazyTensor, is_causal: bool, scale: float | None) -> int:
    enabled = torch._C._get_flash_sdp_enabled()
    key = (q._meta, k._meta, v._meta, is_causal, scale, enabled)
    choice = _CHOICE.get(key)
    if choice is None:
        cpu = [torch.empty_strided(t._meta[0], t._meta[2], dtype=t._meta[1]) for t in (q, k, v)]
        choice = _CHOICE[key] = int(aten._fused_sdp_choice(*cpu, None, 0.0, is_causal, scale=scale))
    return choice


class _FusedAttention(torch.autograd.Function):
    """``xla_dtensor::attention`` with its backward op as the gradient."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any,
                is_causal: bool, scale: float) -> torch.Tensor:
        out = call_op(ATTENTION, q, k, v, mask, bias, is_causal, scale)
        ctx.save_for_backward(q, k, v, mask, bias, out)
        ctx.is_causal, ctx.scale = is_causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        q, k, v, mask, bias, out = ctx.saved_tensors
        dq, dk, dv = call_op(ATTENTION_BACKWARD, grad, q, k, v, mask, bias, out, ctx.is_causal, ctx.scale)
        return dq, dk, dv, None, None, None, None


def fusable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: Any, dropout_p: float,
            is_causal: bool, enable_gqa: bool) -> bool:
    """Whether the fused op computes exactly this SDPA call (else torch's decomposition runs).

    Example:
        >>> import torch
        >>> q = torch.empty(2, 4, 8, 16, device="meta")
        >>> fusable(q, q, q, None, 0.0, True, False), fusable(q, q, q, None, 0.1, True, False)
        (True, False)
    """
    if dropout_p or not config.fused_attention or not q.is_floating_point():
        return False
    if not (q.dim() == k.dim() == v.dim() and q.dim() in (3, 4)) or not q.dtype == k.dtype == v.dtype:
        return False
    (hq, lq, e), (hk, s, ek), (hv, sv, ev) = q.shape[-3:], k.shape[-3:], v.shape[-3:]
    if not (e == ek == ev and s == sv and hk == hv and q.shape[:-3] == k.shape[:-3] == v.shape[:-3]):
        return False
    if hq != hk and not (enable_gqa and hq % hk == 0):
        return False
    if is_causal and (attn_mask is not None or lq != s):  # torch's errors / its bottom-right alignment
        return False
    if attn_mask is None:
        return True
    if attn_mask.requires_grad or attn_mask.dim() > 4 or not (
            attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        return False
    try:
        torch.broadcast_shapes(attn_mask.shape, (q.shape[0] if q.dim() == 4 else 1, hq, lq, s))
    except RuntimeError:
        return False
    return True


def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, is_causal: bool,
          scale: float) -> torch.Tensor:
    """One counted ``xla_dtensor::attention`` call (with its backward op) on arguments :func:`fusable` took.

    Also the target of the hand-written pattern (:mod:`xla_dtensor.core.attention_pattern`).
    """
    metrics.incr("fused_attention")
    why = refusal(platform(), str(q.dtype).removeprefix("torch."), q.shape[-1])
    if why:
        metrics.incr("fused_attention_fallbacks")
        warn_once(why)
    return _APPLY(q, k, v, mask, bias, is_causal, scale)


def _sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: float | None = None, enable_gqa: bool = False) -> Any:
    if STATE.runs_at_once():  # eager mode: torch CPU's own kernel choice
        if (attn_mask is None and not dropout_p and not enable_gqa
                and type(q) is LazyTensor and type(k) is LazyTensor and type(v) is LazyTensor
                and _cpu_choice(q, k, v, is_causal, scale) == _FLASH):
            return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)[0]
    elif fusable(q, k, v, attn_mask, dropout_p, is_causal, enable_gqa):
        boolean = attn_mask is not None and attn_mask.dtype == torch.bool
        mask, bias = (attn_mask, None) if boolean else (None, attn_mask)
        return fused(q, k, v, mask, bias, is_causal, 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale))
    return aten.scaled_dot_product_attention.default.decompose(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


def _apply() -> Any:
    """What :func:`fused` calls: the core's C++ ``attention`` (the same op and gradient op with a C++ autograd
    node; it hands the calls it does not take to ``_FusedAttention.apply``), else ``_FusedAttention.apply``."""
    from xla_dtensor.core import linear
    if linear.KERNEL != "cxx":
        return _FusedAttention.apply
    from xla_dtensor.core import cxx
    cxx.MODULE.install_attention(_FusedAttention.apply, ATTENTION, ATTENTION_BACKWARD)
    return cxx.MODULE.attention


_APPLY = _apply()
_LIB.impl("scaled_dot_product_attention", _sdpa, "AutogradPrivateUse1")
