"""DCP planners that refuse what would load wrong: missing keys, mismatched targets, unsafe objects.

:class:`SavePlanner` is DCP's default one plus two rules: a non-tensor value is stored
only if it loads back through ``torch.load(weights_only=True)`` (else a
:class:`CheckpointError` at save time, naming the key), and with several JAX processes
each process plans only its own shards (process 0 also writes the plain values); the
processes' parts are checked for coverage when process 0 merges them.

:class:`LoadPlanner` checks every target before anything is read: its key is in the
checkpoint, its kind (tensor or value), shape and dtype match, and the stored chunks
cover every element this process must fill. Non-tensor values are read with
``torch.load(weights_only=True)``. With ``stage=True`` (the default) it is also
all-or-nothing under any storage reader (torch's ``FileSystemReader`` included): CPU
tensor pieces are read into staging copies and plain values held back, and both are
written to the targets only once every item of this process's plan has been read
(device targets are staged by their load sessions, :mod:`~xla_dtensor.checkpoint.hooks`).
The staging costs a host copy of the CPU targets; :func:`xla_dtensor.checkpoint.load`,
whose reader verifies everything before writing, plans with ``stage=False``.

Example:
    >>> import io, torch
    >>> from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata
    >>> p = LoadPlanner(); p.set_up_planner({"w": torch.zeros(2)}, Metadata({}))
    >>> p.create_local_plan()
    Traceback (most recent call last):
    ...
    xla_dtensor.checkpoint.errors.CheckpointError: key 'w' is not in the checkpoint (it holds [])
"""
from __future__ import annotations

import dataclasses
import io
import math
from collections import ChainMap
from typing import Any

import jax
import torch
from torch.distributed.checkpoint.default_planner import (
    DefaultLoadPlanner,
    DefaultSavePlanner,
    create_default_global_save_plan,
)
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadPlan, ReadItem, SavePlan, WriteItem, WriteItemType
from torch.distributed.checkpoint.planner_helpers import _create_chunk_list
from torch.distributed.checkpoint._traverse import set_element

from xla_dtensor.checkpoint import hooks
from xla_dtensor.checkpoint.errors import CheckpointError
from xla_dtensor.core.tensor import LazyTensor


class SavePlanner(DefaultSavePlanner):
    """DCP's default save planner, safe to load back and multi-process aware (module doc)."""

    def set_up_planner(self, state_dict: dict[str, Any], storage_meta: Any = None, is_coordinator: bool = False) -> None:
        try:
            super().set_up_planner(state_dict, storage_meta, is_coordinator)
        except ValueError as err:
            if "duplicated flatten key" not in str(err):
                raise
            raise CheckpointError(f"two entries of the state dict flatten to the same key ({err}): nested dicts are "
                                  f"stored under their dotted path, e.g. {{'a': {{'b': x}}}} as 'a.b'") from None

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        if jax.process_index() != 0:  # process 0 writes the values every process holds
            items = [w for w in plan.items if isinstance(self.state_dict.get(w.index.fqn), LazyTensor)]
            plan = dataclasses.replace(plan, items=items)
            self.plan = plan
        return plan

    def create_global_plan(self, all_plans: list[SavePlan]) -> tuple[list[SavePlan], Metadata]:
        if jax.process_count() == 1:
            return super().create_global_plan(all_plans)
        # NOTE: one process sees only its own shards; coverage is checked when process 0 merges
        plans, metadata = create_default_global_save_plan(self._dedup_save_plans(all_plans))
        if self.flatten_state_dict:
            metadata = dataclasses.replace(metadata, planner_data=dict(ChainMap(*[p.planner_data for p in plans])))
        self.global_plan, self.metadata = plans, metadata
        return plans, metadata

    def transform_object(self, write_item: WriteItem, object: Any) -> Any:  # noqa: A002
        out = super().transform_object(write_item, object)
        if write_item.type == WriteItemType.BYTE_IO:
            try:
                torch.load(io.BytesIO(out.getvalue()), weights_only=True)
            except Exception as err:
                raise CheckpointError(
                    f"{write_item.index.fqn!r}: a {type(object).__name__} cannot be stored, because loading reads "
                    f"non-tensor values with torch.load(weights_only=True) (plain Python numbers, strings, "
                    f"lists, tuples, dicts, None and tensors); {type(err).__name__}: {str(err)[:200]}") from None
        return out


class LoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner with every target checked up front, and staged writes (module doc)."""

    def __init__(self, *args: Any, stage: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stage = stage
        self._unread: int | None = None  # items of the final plan not read yet (None: not staging)
        self._staged: list[tuple[Any, Any]] = []  # (CPU target piece, its staging copy) or (key, plain value)

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        plan = super().finish_plan(new_plan)
        if self.stage:
            self._unread, self._staged = len(plan.items), []
        return plan

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        target = super().resolve_tensor(read_item)
        if self._unread is None or hooks.is_staging(target):
            return target
        copy = torch.empty_like(target)
        self._staged.append((target, copy))
        return copy

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        self._read_one()

    def _read_one(self) -> None:
        """Count an item read; after the last one, write every staged piece and value."""
        if self._unread is None:
            return
        self._unread -= 1
        if self._unread > 0:
            return
        for where, what in self._staged:
            if isinstance(where, torch.Tensor):
                where.copy_(what)
            else:
                self._set_value(where, what)
        self._staged, self._unread = [], None

    def create_local_plan(self) -> LoadPlan:
        assert self.metadata is not None
        stored = self.metadata.state_dict_metadata
        for key, obj in self.state_dict.items():
            _check_target(key, obj, stored)
        plan = super().create_local_plan()
        _check_coverage(self.state_dict, plan.items)
        return plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        key = read_item.dest_index.fqn
        try:
            obj = torch.load(value, weights_only=True)
        except Exception as err:
            raise CheckpointError(f"{key!r}: the stored value is not plain data torch.load(weights_only=True) "
                                  f"accepts ({type(err).__name__}: {str(err)[:200]})") from None
        if self._unread is None:
            self._set_value(key, obj)
            return
        self._staged.append((key, obj))
        self._read_one()

    def _set_value(self, key: str, obj: Any) -> None:
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[key], obj)
        else:
            self.state_dict[key] = obj


def _check_target(key: str, obj: Any, stored: dict[str, Any]) -> None:
    md = stored.get(key)
    if md is None:
        raise CheckpointError(f"key {key!r} is not in the checkpoint (it holds {sorted(stored)[:20]})")
    if isinstance(md, BytesStorageMetadata):
        if isinstance(obj, torch.Tensor):
            raise CheckpointError(f"{key!r}: the checkpoint holds a non-tensor value, the target is a tensor")
        return
    assert isinstance(md, TensorStorageMetadata)
    if not isinstance(obj, torch.Tensor):
        raise CheckpointError(f"{key!r}: the checkpoint holds a tensor {tuple(md.size)} {md.properties.dtype}, "
                              f"the target is a {type(obj).__name__}; give a tensor of that shape to fill")
    if tuple(obj.shape) != tuple(md.size) or obj.dtype != md.properties.dtype:
        raise CheckpointError(f"{key!r}: the checkpoint holds {tuple(md.size)} {md.properties.dtype}, "
                              f"the target is {tuple(obj.shape)} {obj.dtype}")


def _target_chunks(obj: torch.Tensor) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    session = obj.__dict__.get("_dcp_session") if isinstance(obj, LazyTensor) else None
    if session is not None:
        return list(session.boxes)
    return [(tuple(c.offsets), tuple(c.sizes)) for c in _create_chunk_list(obj)]


def _check_coverage(state_dict: dict[str, Any], items: list[ReadItem]) -> None:
    """Every element of every tensor target this process fills is read exactly once."""
    got: dict[tuple[str, tuple[int, ...]], int] = {}
    for r in items:
        if r.dest_index.offset is not None:
            k = (r.dest_index.fqn, tuple(r.dest_index.offset))
            got[k] = got.get(k, 0) + math.prod(r.lengths)
    for key, obj in state_dict.items():
        if not isinstance(obj, torch.Tensor):
            continue
        session = obj.__dict__.get("_dcp_session") if isinstance(obj, LazyTensor) else None
        if session is not None:
            session.key = key
        for off, size in _target_chunks(obj):
            need, have = math.prod(size), got.get((key, off), 0)
            if need and have != need:
                raise CheckpointError(f"{key!r}: the checkpoint holds {have} of the {need} elements of the piece "
                                      f"at {list(off)} of size {list(size)} (a part of the checkpoint is missing)")


def unfilled_targets() -> list[str]:
    """Keys (or descriptions) of our tensors whose load did not complete; closes their sessions."""
    out = []
    for s in hooks.pending_sessions():
        have, need = s.filled()
        out.append(f"{getattr(s, 'key', '<unnamed>')!r} ({have} of {need} elements)")
    hooks.close_sessions()
    return out
