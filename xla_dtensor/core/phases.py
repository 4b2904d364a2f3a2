"""A lazy training step launched in phases: the forward when ``backward()`` starts, the backward when it ends.

Recorded whole, a lazy step is one program that starts on the device only at ``sync()``,
after the host has recorded all of it, so a loop that reads the loss every step pays
recording, then the device, in sequence. ``loss.backward()`` on a lazy tensor instead
launches what is pending when it starts (the forward: the device runs it while the host
records the backward) and again when it returns (the backward: it runs while the host
records the optimizer step). Each launch is a plain asynchronous :func:`sync`: the values
are the same, each phase's program is compiled once and reused, and the step's ``sync()``
launches the optimizer step.

On by default on a GPU or TPU (``xla_dtensor.config.launch_at_backward``: ``None``), where
the device's time is worth overlapping. Measured on one H100 (12-layer GPT-2 width 768,
float32, SGD, ``benchmarks/accelerator_step.py``): with the loss read every step, the step
went from 84.0 to 45.0 ms against torch eager's 42.6 (1.97x to 1.06x), transformers' GPT-2
from 108.7 to 54.5 ms against 60.3 (1.80x to 0.90x); with the loss read every 5th step,
where the next steps' recording already overlaps the device, from 51.9 to 45.1 ms and from
60.8 to 56.9 ms. Off by default on CPU: XLA's threads share the host's cores, so there is little to
overlap, and the two launches add host time: 1.24x the step's as one program on the 12-layer
width-64 GPT (``benchmarks/lazy_overhead.py``, the 2-core development machine), for 0.93x its
time when each step waits for the device.

The price: the fused attention's backward recomputes its forward (the residuals stay inside
the forward's program), and fusion stops at the two launches.

Never under ``xla_dtensor.compile`` (which records the call as one program), in eager mode
(nothing is pending), or while a component listed in :data:`WHOLE_STEP` needs each step
whole at its sync (the AUTO sharding policy plans on, and constrains, the whole step's
graph). ``torch.autograd.backward`` and ``torch.autograd.grad`` called directly launch
nothing.

Example:
    >>> import torch, xla_dtensor
    >>> w = torch.ones(3, device=xla_dtensor.device(), requires_grad=True)
    >>> xla_dtensor.config.launch_at_backward = True   # on CPU too
    >>> (w * 2).sum().backward()   # the forward launched at the start, the gradient at the end
    >>> w.grad.cpu()
    tensor([2., 2., 2.])
    >>> xla_dtensor.config.launch_at_backward = None
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from xla_dtensor.config import config
from xla_dtensor.core import threads
from xla_dtensor.core.device import platform
from xla_dtensor.core.executor import sync
from xla_dtensor.core.state import STATE

__all__ = ["WHOLE_STEP", "launches", "backward"]

# Predicates of components that need each training step's graph whole at sync(): while one
# answers True, backward() launches nothing (AUTO registers one while it has a live scope).
WHOLE_STEP: list[Callable[[], bool]] = []


def launches() -> bool:
    """Whether ``backward()`` on a lazy tensor launches the pending work at its start and end now."""
    mode = config.launch_at_backward
    if not (mode or mode is None and platform() != "cpu"):
        return False
    if STATE.capturing or threads.in_eager_mode():
        return False  # compile records the call whole; this thread runs in eager mode
    return not any(needs() for needs in WHOLE_STEP)


def backward(tensor: Any, *args: Any, **kwargs: Any) -> None:
    """``torch.Tensor.backward(tensor, ...)``, launching the pending work before and after it (see module doc)."""
    launch = launches()
    if launch:
        sync()
    torch.Tensor.backward(tensor, *args, **kwargs)
    if launch:
        sync()
