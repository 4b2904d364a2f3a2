"""torch.distributed.checkpoint's tensor protocol on ``LazyTensor`` (and so ``XLAShardedTensor``).

DCP looks for three methods on a tensor (``__create_write_items__``, ``__create_chunk_list__``,
``__get_tensor_shard__``). They are installed here when ``import xla_dtensor`` runs and load
:mod:`xla_dtensor.checkpoint.hooks`, which does the work, at their first call: importing
``torch.distributed.checkpoint`` costs ~0.6 s, which a program that never checkpoints should
not pay at start-up.

Example:
    >>> from xla_dtensor.core.tensor import LazyTensor
    >>> LazyTensor.__create_chunk_list__ is _create_chunk_list
    True
"""
from __future__ import annotations

from typing import Any

from xla_dtensor.core.tensor import LazyTensor


def _create_write_items(t: LazyTensor, fqn: str, obj: Any) -> list:
    from xla_dtensor.checkpoint import hooks
    return hooks.write_items(fqn, t)


def _create_chunk_list(t: LazyTensor) -> list:
    from xla_dtensor.checkpoint import hooks
    return hooks.chunk_list(t)


def _get_tensor_shard(t: LazyTensor, index: Any) -> Any:
    from xla_dtensor.checkpoint import hooks
    return hooks.tensor_shard(t, index)


LazyTensor.__create_write_items__ = _create_write_items  # type: ignore[attr-defined]
LazyTensor.__create_chunk_list__ = _create_chunk_list  # type: ignore[attr-defined]
LazyTensor.__get_tensor_shard__ = _get_tensor_shard  # type: ignore[attr-defined]
