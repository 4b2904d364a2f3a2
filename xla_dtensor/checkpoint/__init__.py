"""Sharded checkpoints in torch.distributed.checkpoint (DCP) format: atomic, verified, resharding.

``save(state_dict, dir)`` writes a DCP checkpoint: every device's shard straight from its
own buffer (replica 0 only, nothing gathered), one ``__{process}_0.distcp`` file per
process, torch's ``.metadata``, and a JSON manifest with each stored item's SHA-256,
written last. The directory is built as a hidden sibling and renamed into place, so a
killed save leaves the previous checkpoint (or none), never a mix.

``load(targets, dir)`` fills each target in place, in the target's own layout (each
device reads only the stored pieces overlapping its shard): the mesh and placements
may differ from the saved ones. CPU tensors, device tensors and plain values all load.
It refuses, with a :class:`CheckpointError` naming the file or key, a directory without
the manifest, a missing/truncated/altered file, a key absent from the checkpoint, a
target of another shape, dtype or kind, and stored pieces that do not cover a target.
Nothing is unpickled: the manifest is JSON, tensors and values are read with
``torch.load(weights_only=True)``.

Plain DCP works too: ``dcp.save(model.state_dict(), checkpoint_id=dir)`` and ``dcp.load``
accept our tensors (they implement DCP's tensor protocol, see :mod:`.hooks`), and a
checkpoint saved here loads with ``dcp.load`` into an ordinary CPU model. A directory
written by plain ``dcp.save`` loads here with ``allow_unverified=True``.

Example:
    >>> import tempfile, torch, xla_dtensor
    >>> from torch.distributed.tensor import Shard
    >>> from mesh import Mesh
    >>> m = Mesh(range(8), (8,), ("x",))
    >>> sd = {"w": xla_dtensor.distribute_tensor(torch.arange(16.).reshape(8, 2), m, [Shard(0)]), "step": 3}
    >>> path = tempfile.mkdtemp() + "/ckpt"
    >>> save(sd, path)
    >>> out = load({"w": xla_dtensor.distribute_tensor(torch.zeros(8, 2), m, [Shard(1)]), "step": 0}, path)
    >>> torch.equal(out["w"].cpu(), torch.arange(16.).reshape(8, 2)), out["step"]
    (True, 3)
"""
from __future__ import annotations

import contextlib
import math
import os
import warnings
from typing import Any, Iterator

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from xla_dtensor.checkpoint import hooks
from xla_dtensor.checkpoint.errors import CheckpointError
from xla_dtensor.checkpoint.planners import LoadPlanner, SavePlanner, unfilled_targets
from xla_dtensor.checkpoint.storage import Reader, Writer

__all__ = ["CheckpointError", "LoadPlanner", "Reader", "SavePlanner", "Writer", "load", "save"]


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it runs without torch.distributed: that is the single-controller design here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"torch\.distributed is (disabled|unavailable)")
        yield


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """Re-raise the CheckpointError (or other error) DCP wraps in its per-rank CheckpointException."""
    try:
        yield
    except CheckpointException as wrapped:
        inner = next(iter(wrapped.failures.values()), None)
        inner = inner[0] if isinstance(inner, tuple) else inner  # (exception, stack summary)
        if isinstance(inner, BaseException):
            raise inner from None
        raise


def _check_args(state_dict: Any, path: Any) -> None:
    if not isinstance(state_dict, dict):
        raise TypeError(f"state_dict must be a dict (nested dicts allowed), got {type(state_dict).__name__}")
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"path must be a non-empty str or os.PathLike directory, got {path!r}")


def save(state_dict: dict[str, Any], path: str | os.PathLike, *, timeout: float = 300.0) -> None:
    """Write ``state_dict`` (nested dicts allowed) as a checkpoint directory ``path``.

    ``path`` must be absent, empty or an earlier checkpoint (which is replaced
    atomically). With several JAX processes every process calls ``save`` with the same
    path; ``timeout`` bounds the wait for the others.

    Raises:
        CheckpointError: ``path`` is another kind of directory; a value that
            ``torch.load(weights_only=True)`` could not read back; a process that did not
            report its part.
        ValueError: ``timeout`` is not a positive number of seconds.

    Example:
        >>> import tempfile, torch
        >>> save({"w": torch.ones(2), "step": 3}, tempfile.mkdtemp() + "/ckpt")
    """
    _check_args(state_dict, path)
    if not (isinstance(timeout, (int, float)) and math.isfinite(timeout) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    from xla_dtensor.core.executor import sync
    sync()
    with _quiet(), _unwrapped():
        dcp.save(state_dict, storage_writer=Writer(path, timeout=timeout), planner=SavePlanner(), no_dist=True)


def load(state_dict: dict[str, Any], path: str | os.PathLike, *, allow_unverified: bool = False) -> dict[str, Any]:
    """Fill ``state_dict``'s tensors in place (and replace its plain values) from ``path``; returns it.

    ``allow_unverified=True`` also accepts a directory written by plain ``dcp.save`` (it
    has no manifest, so no checksums; sizes and paths are still checked).

    Raises:
        CheckpointError: see the module doc; the message names the file or key.

    Example:
        >>> import tempfile, torch
        >>> path = tempfile.mkdtemp() + "/ckpt"
        >>> save({"w": torch.arange(3.)}, path)
        >>> load({"w": torch.zeros(3)}, path)["w"]
        tensor([0., 1., 2.])
    """
    _check_args(state_dict, path)
    reader = Reader(path, allow_unverified=allow_unverified)
    reader.read_metadata()  # NOTE: first here: DCP would turn the CheckpointError into an AssertionError
    hooks.close_sessions()
    try:
        with _quiet(), _unwrapped():
            dcp.load(state_dict, storage_reader=reader, planner=LoadPlanner(stage=False), no_dist=True)
    finally:
        unfilled = unfilled_targets()
    if unfilled:
        raise CheckpointError(f"{path!s}: these targets were not filled: {', '.join(unfilled)}")
    return state_dict
