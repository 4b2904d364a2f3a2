"""Eager mode: every op executes at once, through the per-program executable cache.

``eager_mode(True)`` makes each aten op on the ``jax`` device run as soon as it is
recorded (its outputs and the tensors it writes are materialized; views stay views of
materialized storage); :mod:`xla_dtensor.core.at_once` does the running, through a
one-op executable cache, and in-place ops reuse the buffers they overwrite. Ops are
recorded without hash-consing, since nothing stays pending to share. ``xla_dtensor.compile(fn)`` still
traces ``fn`` lazily (with hash-consing) and compiles it whole inside eager mode
(torch_xla's eager-plus-compile workflow).

Example:
    >>> import torch, xla_dtensor
    >>> xla_dtensor.eager_mode(True)
    >>> y = torch.ones(2, device=xla_dtensor.device()) + 1   # runs now
    >>> xla_dtensor.eager_mode(False)
"""
from __future__ import annotations

import contextlib

import torch

from xla_dtensor.core import executor, state
from xla_dtensor.core import threads as _threads
from xla_dtensor.core.state import STATE

__all__ = ["eager_mode", "is_eager", "suspended"]


class _Eager:
    """A thread's eager mode: the autograd multithreading setting it had before (restored when off)."""

    __slots__ = ("autograd_threads",)

    def __init__(self, autograd_threads: bool) -> None:
        self.autograd_threads = autograd_threads


def eager_mode(enable: bool) -> None:
    """Run every op at once (``True``) or record lazily until a barrier (``False``, the default).

    The mode is per thread (a new thread starts lazy); backward ops that torch's autograd
    thread runs for a thread follow that thread's mode. Its pending lazy work is synced
    when eager mode is turned on. While it is on, the thread runs ``backward()`` itself
    instead of handing it to torch's autograd device thread
    (``torch.autograd.set_multithreading_enabled(False)``, a per-thread setting; turning
    eager mode off restores it). With ~200 backward ops each running at once, the
    handoffs between the two threads cost a quarter of an eager training step.

    Example:
        >>> eager_mode(False)
    """
    if not isinstance(enable, bool):
        raise TypeError(f"eager_mode expects a bool, got {type(enable).__name__}: {enable!r}")
    with _threads.held():
        me = _threads.me()
        if enable:
            executor.sync()
            if me not in STATE.modes:
                STATE.modes[me] = _Eager(torch._C._is_multithreading_enabled())
                torch._C._set_multithreading_enabled(False)
        else:
            mode = STATE.modes.pop(me, None)
            if mode is not None:
                torch._C._set_multithreading_enabled(mode.autograd_threads)
        state.install(STATE.modes.get(me))


def is_eager() -> bool:
    """Whether eager mode is on (for the calling thread)."""
    return _threads.in_eager_mode()


def suspended() -> contextlib.AbstractContextManager[None]:
    """Record lazily inside this block even in eager mode (used by ``compile`` while tracing).

    Example:
        >>> with suspended():
        ...     pass
    """
    return state.suspended()
