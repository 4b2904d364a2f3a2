"""``torch_xla.experimental.distributed_checkpoint``: DCP planners and ``CheckpointManager``.

``SPMDSavePlanner`` / ``SPMDLoadPlanner`` are :mod:`xla_dtensor.checkpoint`'s DCP planners:
``dcp.save(sd, storage_writer=FileSystemWriter(p), planner=SPMDSavePlanner())`` writes
each device's shard, and loading reshards into the targets' layouts.

:class:`CheckpointManager` keeps step checkpoints ``<path>/<step>``, each written
atomically by :func:`xla_dtensor.checkpoint.save` (a killed save leaves no partial step).

Example:
    >>> import tempfile, torch
    >>> m = CheckpointManager(tempfile.mkdtemp(), save_interval=10, max_to_keep=2)
    >>> [m.save(s, {"w": torch.full((2,), float(s))}) for s in (0, 5, 10, 20)]
    [True, False, True, True]
    >>> m.all_steps()
    [10, 20]
    >>> sd = {"w": torch.zeros(2)}; m.restore(10, sd), sd["w"].tolist()
    (None, [10.0, 10.0])
    >>> m.restore_latest(sd), sd["w"].tolist()
    (20, [20.0, 20.0])
"""
from __future__ import annotations

import os
import shutil
import threading
from typing import Any

import torch

from xla_dtensor import checkpoint as _ckpt
from xla_dtensor.checkpoint import LoadPlanner as SPMDLoadPlanner
from xla_dtensor.checkpoint import SavePlanner as SPMDSavePlanner
from xla_dtensor.core.tensor import LazyTensor

__all__ = ["CheckpointManager", "SPMDLoadPlanner", "SPMDSavePlanner", "UntrackedStepError", "prime_optimizer"]


class UntrackedStepError(ValueError, AssertionError):
    """``CheckpointManager.restore`` of a step with no complete checkpoint."""


def _to_host(x: Any) -> Any:
    if isinstance(x, LazyTensor):
        return x.detach().cpu()
    if isinstance(x, dict):
        return {k: _to_host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_host(v) for v in x)
    return x


class CheckpointManager:
    """Step checkpoints under ``path``: interval, ``max_to_keep``, async saves, restore latest.

    Args:
        path: the directory holding one sub-directory per saved step.
        save_interval: ``should_save(step)`` is true for multiples of it.
        max_to_keep: keep at most this many steps (the newest); 0 keeps all.
        max_pending_async: async saves that may be in flight before ``save_async`` waits
            (``async_queue_size`` is the same, an older name).
        num_of_threads, process_group, chkpt_on_preemption: accepted (one controller
            process; preemption sync points are not provided).

    Raises:
        ValueError: a non-positive ``save_interval``, or a negative ``max_to_keep``.
    """

    def __init__(self, path: str | os.PathLike, save_interval: int, max_to_keep: int = 0,
                 max_pending_async: int = 1, num_of_threads: int = 1, process_group: Any = None,
                 chkpt_on_preemption: bool = True, *, async_queue_size: int | None = None) -> None:
        if not isinstance(save_interval, int) or save_interval < 1:
            raise ValueError(f"save_interval must be an int >= 1, got {save_interval!r}")
        if not isinstance(max_to_keep, int) or max_to_keep < 0:
            raise ValueError(f"max_to_keep must be an int >= 0 (0: keep all), got {max_to_keep!r}")
        self.base_path, self.save_interval, self.max_to_keep = os.fspath(path), save_interval, max_to_keep
        os.makedirs(self.base_path, exist_ok=True)
        pending = max_pending_async if async_queue_size is None else async_queue_size
        self._slots = threading.BoundedSemaphore(max(1, int(pending)))
        self._threads: list[threading.Thread] = []
        self._errors: list[BaseException] = []
        self._lock = threading.Lock()

    def _dir(self, step: int) -> str:
        return os.path.join(self.base_path, str(int(step)))

    def should_save(self, step: int) -> bool:
        """Whether ``step`` is a multiple of ``save_interval``."""
        return step % self.save_interval == 0

    def all_steps(self) -> list[int]:
        """The steps with a complete checkpoint, ascending."""
        steps = []
        for name in os.listdir(self.base_path):
            if name.isdigit() and os.path.exists(os.path.join(self.base_path, name, ".metadata")):
                steps.append(int(name))
        return sorted(steps)

    def _prune(self) -> None:
        if self.max_to_keep:
            for step in self.all_steps()[:-self.max_to_keep]:
                shutil.rmtree(self._dir(step), ignore_errors=True)

    def _write(self, step: int, state_dict: dict[str, Any]) -> None:
        _ckpt.save(state_dict, self._dir(step))
        with self._lock:
            self._prune()

    def save(self, step: int, state_dict: dict[str, Any], force: bool = False) -> bool:
        """Save ``state_dict`` as ``step`` if ``should_save(step)`` or ``force``; returns whether it did."""
        if not (force or self.should_save(step)):
            return False
        self.join()
        self._write(step, state_dict)
        return True

    def save_async(self, step: int, state_dict: dict[str, Any], force: bool = False) -> bool:
        """As :meth:`save`, but the write runs in a background thread: the tensors are copied to
        the host first (so training may change them at once), then written."""
        if not (force or self.should_save(step)):
            return False
        self._raise_failed()
        host = _to_host(state_dict)
        self._slots.acquire()

        def run() -> None:
            try:
                self._write(step, host)
            except BaseException as err:  # reported by the next call or join()
                self._errors.append(err)
            finally:
                self._slots.release()
        t = threading.Thread(target=run, name=f"xla_dtensor-ckpt-{step}", daemon=True)
        self._threads.append(t)
        t.start()
        return True

    def _raise_failed(self) -> None:
        if self._errors:
            raise self._errors.pop(0)

    def join(self) -> None:
        """Wait for the async saves in flight; re-raise the first that failed."""
        for t in self._threads:
            t.join()
        self._threads.clear()
        self._raise_failed()

    def restore(self, step: int, state_dict: dict[str, Any]) -> None:
        """Fill ``state_dict`` in place from step ``step`` (resharded into its layouts).

        Raises:
            UntrackedStepError: (a ``ValueError`` and, as in torch_xla, an ``AssertionError``)
                no complete checkpoint for ``step``; the message lists the saved steps.
        """
        self.join()
        if int(step) not in self.all_steps():
            raise UntrackedStepError(f"no checkpoint for step {step} in {self.base_path}; "
                                     f"saved steps: {self.all_steps()}")
        _ckpt.load(state_dict, self._dir(step))

    load = restore

    def restore_latest(self, state_dict: dict[str, Any]) -> int | None:
        """Load the newest step into ``state_dict``; returns that step, or ``None`` if there is none."""
        steps = self.all_steps() if not self._threads else (self.join() or self.all_steps())
        if not steps:
            return None
        self.restore(steps[-1], state_dict)
        return steps[-1]


def prime_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Create ``optimizer``'s state (zero gradients, one step at lr 0 would change nothing
    for most optimizers, so the state is built by a step on zero gradients) so that a
    checkpoint can be loaded into it; returns it."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups]
    for g in optimizer.param_groups:
        g["lr"] = 0.0
    optimizer.step()
    for g, lr in zip(optimizer.param_groups, lrs):
        g["lr"] = lr
    optimizer.zero_grad(set_to_none=True)
    return optimizer
