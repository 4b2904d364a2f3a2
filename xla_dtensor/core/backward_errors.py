"""Errors in ops that torch's C++ autograd engine runs during ``backward()``.

NOTE: an exception leaving ``__torch_dispatch__`` inside a C++ backward function
aborts the process: while it unwinds, a ``noexcept`` stream-guard destructor calls the
Python PrivateUse1 device guard with our Python error still set, which throws, and
C++ calls ``std::terminate``. So inside backward an op never raises. It returns
*poisoned* tensors with the right metadata whose value re-raises the error if it is
ever computed (``sync()`` skips them; a ``.grad`` left holding one raises when read), and a callback queued on the engine raises the first error as soon as
the backward pass ends, in the thread that called ``backward()``.
"""
from __future__ import annotations

import functools
import itertools
from typing import Any

import torch

from xla_dtensor.core.ir import make_node
from xla_dtensor.core.tensor import LIVE, LazyTensor, new_tensor

_POISON = "poisoned"
_ids = itertools.count()
_pending: dict[int, list[BaseException]] = {}  # per backward pass (autograd graph task): its errors


def in_backward() -> bool:
    """True while the autograd engine runs a backward node (in any thread)."""
    return torch._C._current_autograd_node() is not None


def poisoned_result(op: Any, args: tuple, kwargs: dict, error: BaseException) -> Any:
    """Outputs shaped like ``op``'s whose values re-raise ``error``; schedules the re-raise.

    NOTE: per backward pass: with several threads, torch's autograd thread interleaves their passes.
    """
    task = torch._C._current_graph_task_id()
    if task not in _pending:
        _pending[task] = []
        torch.autograd.Variable._execution_engine.queue_callback(functools.partial(_raise_pending, task))
    _pending[task].append(error)
    return _wrap(_output_metas(op, args, kwargs), error)


def _raise_pending(task: int) -> None:
    errors = _pending.pop(task, [])
    if errors:
        raise errors[0]


def _output_metas(op: Any, args: tuple, kwargs: dict) -> Any:
    from xla_dtensor.core.entries import _meta

    try:
        return op(*(_meta(a) for a in args), **{k: _meta(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no metadata: mirror the first tensor argument
        first = next((a for a in args if isinstance(a, LazyTensor)), None)
        return torch.empty(0, device="meta") if first is None else _meta(first)


def _wrap(out: Any, error: BaseException) -> Any:
    if isinstance(out, torch.Tensor):
        def fn() -> Any:
            raise error
        key = (_POISON, next(_ids))
        node = make_node(_POISON, key, hash(key), (), fn)
        t = new_tensor((tuple(out.shape), out.dtype, tuple(out.stride())), node)
        LIVE.discard(t._storage)  # sync() skips it; only computing it (or a user of it) raises
        return t
    if isinstance(out, (list, tuple)):
        return type(out)(_wrap(o, error) for o in out)
    return out
