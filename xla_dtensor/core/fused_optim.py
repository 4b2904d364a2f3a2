"""torch's Adam, AdamW and SGD take their fused implementation on the ``jax`` device by default.

Given neither ``foreach`` nor ``fused``, torch picks the multi-tensor (``_foreach_*``)
implementation for a ``jax`` parameter list: ~10 list ops a step, each one recorded op
plus one output node and one write per parameter, with torch's Python between them.
The fused one (``_fused_adamw_``...) is one recorded op (and one ``_foreach_add_`` of the
step counters): on the 12-layer benchmark GPT the AdamW step records 786 ops instead of
1,576 and the step's host time falls by ~20% (``benchmarks/results/lazy_overhead.md``).
Both compute the same update; torch keeps a fused optimizer's step counters on the
device, as it does on CUDA.

A global optimizer pre-step hook switches a parameter group to ``fused=True`` at its
first step when all hold: the optimizer's class is exactly ``Adam``, ``AdamW`` or
``SGD``; the group left ``foreach`` and ``fused`` unset (``None``) and is not
``differentiable``; every parameter is a floating-point lazy tensor (``LazyTensor`` or a
subclass: ``XLAShardedTensor``, not torch's ``DTensor``); and no parameter of the group
has optimizer state yet (state loaded from a checkpoint keeps the implementation it
was made for); and the step is not being traced by ``xla_dtensor.compile`` (whose signature
holds the groups' settings, and whose replays run no Python). ``xla_dtensor.config.fused_optimizers
= False`` turns the switch off.

Example:
    >>> import torch, xla_dtensor
    >>> w = torch.nn.Parameter(torch.ones(3, device=xla_dtensor.device()))
    >>> opt = torch.optim.AdamW([w], lr=0.1)
    >>> w.sum().backward(); opt.step()
    >>> opt.param_groups[0]["fused"]
    True
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.config import config
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import SUBCLASSES, LazyTensor

_FUSABLE = frozenset({torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD})
_CHECKED = "_xla_dtensor_fused_groups"  # on an optimizer: how many of its groups were looked at


def _lazy_float(p: Any) -> bool:
    return (type(p) is LazyTensor or type(p) in SUBCLASSES) and p.is_floating_point()


def _fusable(opt: torch.optim.Optimizer, group: dict) -> bool:
    if group.get("fused", False) is not None or group.get("foreach", False) is not None:
        return False
    if group.get("differentiable") or not group["params"]:
        return False
    return all(_lazy_float(p) and not opt.state.get(p) for p in group["params"])


def prefer_fused(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
    """The pre-step hook: switch ``opt``'s new groups to ``fused=True`` where the module doc says."""
    groups = opt.param_groups
    seen = getattr(opt, _CHECKED, 0)
    if seen == len(groups) or type(opt) not in _FUSABLE or STATE.capturing:
        return  # NOTE: under xla_dtensor.compile the groups are part of the call's signature: left alone
    setattr(opt, _CHECKED, len(groups))
    if not config.fused_optimizers:
        return
    switched = False
    for group in groups[seen:]:
        if _fusable(opt, group):
            group["fused"] = True
            switched = True
    if switched:  # as torch's constructors do for fused=True: GradScaler hands the optimizer its scale
        opt._step_supports_amp_scaling = True


def install() -> None:
    """Register :func:`prefer_fused` as a global optimizer pre-step hook (once)."""
    global _HANDLE
    if _HANDLE is None:
        from torch.optim.optimizer import register_optimizer_step_pre_hook
        _HANDLE = register_optimizer_step_pre_hook(prefer_fused)


_HANDLE: Any = None
