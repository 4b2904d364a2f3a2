"""``F.scaled_dot_product_attention`` in eager mode: the fused kernel torch CPU would pick.

``aten::scaled_dot_product_attention`` is a composite op: for a PrivateUse1 tensor torch
never asks the backend which fused kernel to use (that choice is a C++ dispatch stub) and
decomposes it into ~20 primitive ops forward and as many backward. On CPU the same call
runs ``_scaled_dot_product_flash_attention_for_cpu`` (one op, with its own backward op).
This module registers an ``AutogradPrivateUse1`` kernel that, in eager mode, makes the
same choice as torch CPU (CPU's own ``_fused_sdp_choice``, asked once per input metadata)
and calls the flash op when CPU would: one executable call per direction instead of ~20.
Otherwise (a mask, dropout, GQA, the flash backend disabled, a tensor subclass wrapping
jax tensors) it runs torch's composite decomposition, as before.

NOTE: lazy tracing and ``compile`` keep the decomposition: there XLA reuses the forward's
softmax in the backward, while the flash backward recomputes it (a compiled GPT-2 step was
~3% slower with the flash ops, in-process A/B at three sizes).
The lowerings of both flash ops are in :mod:`xla_dtensor.ops.attention`.

Example:
    >>> import torch, xla_dtensor
    >>> q = torch.randn(1, 2, 4, 8, device=xla_dtensor.device())
    >>> torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).shape
    torch.Size([1, 2, 4, 8])
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from xla_dtensor.core.tensor import LazyTensor

aten = torch.ops.aten
_FLASH = 1  # torch's SDPBackend.flash_attention as _fused_sdp_choice returns it
_CHOICE: dict[tuple, int] = {}  # (q, k, v metadata, is_causal, scale, flash enabled) -> CPU's choice
WHEN: list[Callable[[], bool]] = [lambda: False]  # set by xla_dtensor.eager: eager mode on, not tracing
_LIB = torch.library.Library("aten", "IMPL")  # noqa: TOR901  (kept alive: the registration lives with it)


def _cpu_choice(q: LazyTensor, k: LazyTensor, v: LazyTensor, is_causal: bool, scale: float | None) -> int:
    enabled = torch._C._get_flash_sdp_enabled()
    key = (q._meta, k._meta, v._meta, is_causal, scale, enabled)
    choice = _CHOICE.get(key)
    if choice is None:
        cpu = [torch.empty_strided(t._meta[0], t._meta[2], dtype=t._meta[1]) for t in (q, k, v)]
        choice = _CHOICE[key] = int(aten._fused_sdp_choice(*cpu, None, 0.0, is_causal, scale=scale))
    return choice


def _sdpa(q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0, is_causal: bool = False,
          scale: float | None = None, enable_gqa: bool = False) -> Any:
    if (WHEN[0]() and attn_mask is None and not dropout_p and not enable_gqa
            and type(q) is LazyTensor and type(k) is LazyTensor and type(v) is LazyTensor
            and _cpu_choice(q, k, v, is_causal, scale) == _FLASH):
        return aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal, scale=scale)[0]
    return aten.scaled_dot_product_attention.default.decompose(
        q, k, v, attn_mask, dropout_p, is_causal, scale=scale, enable_gqa=enable_gqa)


_LIB.impl("scaled_dot_product_attention", _sdpa, "AutogradPrivateUse1")
