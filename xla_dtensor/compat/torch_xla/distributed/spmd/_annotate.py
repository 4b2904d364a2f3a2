"""torch_xla's annotation API: ``mark_sharding`` (re-marking raises), ``clear_sharding``,
``ShardingSpec``, ``ShardingType``, the ``_get_xla_sharding_spec`` reading ('' when
unannotated), and ``dynamo_mark_sharding``.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.compat.torch_xla.distributed.spmd import Mesh
    >>> t = torch.zeros(8, 4).to(xla_dtensor.device())
    >>> get_sharding_spec(t)
    ''
    >>> mark_sharding(t, Mesh(range(8), (4, 2)), (0, 1)).sharding_spec
    '{devices=[4,2]<=[8]}'
"""
from __future__ import annotations

import ast
import enum
from dataclasses import dataclass
from typing import Any, Sequence

import torch

from mesh import Mesh as _Mesh
from xla_dtensor.compat.torch_xla.distributed.spmd._errors import assertion
from xla_dtensor.compat.torch_xla.distributed.spmd._mesh import Mesh
from xla_dtensor.compat.torch_xla.distributed.spmd._tensor import XLAShardedTensor, unwrap_sharded_tensor
from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.sharding import HloSharding, ShardingError, ShardingSpec as _Spec
from xla_dtensor.sharding.errors import RankError
from xla_dtensor.spmd import annotate as _A

__all__ = ["AlreadyShardedError", "ShardingSpec", "ShardingType", "clear_sharding", "dynamo_mark_sharding",
           "get_sharding_spec", "mark_sharding", "sharding_type_of"]


class AlreadyShardedError(ShardingError, RuntimeError):
    """``mark_sharding`` on a tensor that already has another annotation (``overwrite=True`` reshards)."""


class ShardingType(enum.IntEnum):
    """torch_xla's kinds of layout (the values of XLA's ``OpSharding.Type``, plus PARTIAL)."""

    REPLICATED = 0
    MAXIMAL = 1
    TUPLE = 2
    TILED = 3
    MANUAL = 4
    PARTIAL = 5
    UNKNOWN = 6


def _resolve_mesh(mesh: Any) -> _Mesh:
    """A mesh from a mesh, a torch ``DeviceMesh("xla", ...)`` or ``None`` (the global mesh)."""
    return _A.as_mesh(mesh)


def mark_sharding(t: torch.Tensor, mesh: Any, partition_spec: Sequence[Any], *,
                  overwrite: bool = False) -> XLAShardedTensor:
    """Annotate ``t`` in place with ``partition_spec`` on ``mesh``; returns ``t`` wrapped.

    As in torch_xla, a tensor already annotated with another layout is refused (clear it
    first, or pass ``overwrite=True`` to reshard); the same layout again is a no-op.

    Raises:
        AssertionError: (a :class:`RankError`) the spec has not one entry per dim.
        ValueError: an axis name the mesh does not have.
        AlreadyShardedError: (a ``RuntimeError``) ``t`` has another annotation.
    """
    plain = unwrap_sharded_tensor(t)
    plain = _A._require_lazy(plain, "mark_sharding")
    m = _resolve_mesh(mesh)
    with assertion(RankError):
        spec = _Spec.from_partition_spec(m, tuple(partition_spec), ndim=plain.dim())
    old = _A.sticky_spec(plain)
    if old is not None and not overwrite and old.reduced().on_root().to_hlo() != spec.reduced().on_root().to_hlo():
        raise AlreadyShardedError(
            f"tensor {tuple(plain.shape)} is already annotated {old.reduced().on_root().to_hlo()}; "
            f"mark_sharding({tuple(partition_spec)}) would make it {spec.reduced().on_root().to_hlo()}: "
            "call clear_sharding(t) first, or pass overwrite=True to reshard")
    _A.apply_spec(plain, spec)
    return t if isinstance(t, XLAShardedTensor) else XLAShardedTensor(plain)


def clear_sharding(t: torch.Tensor) -> torch.Tensor:
    """Drop the annotation (the data becomes replicated); returns the plain tensor."""
    plain = unwrap_sharded_tensor(t)
    _A.clear_sharding(plain)
    return plain


def get_sharding_spec(t: torch.Tensor) -> str:
    """torch_xla's ``_get_xla_sharding_spec``: the HLO sharding string of ``t``'s annotation,
    or of the layout XLA propagated to a computed value; ``''`` for a tensor that has
    neither (never annotated, not computed from an annotated one).

    A pending value is computed first (its layout is decided by the program).
    """
    plain = unwrap_sharded_tensor(t)
    if not isinstance(plain, LazyTensor):
        return ""
    spec = _A.sticky_spec(plain)
    if spec is not None:
        return str(spec.reduced().on_root().to_hlo())
    if _A.get_spec(plain) is None:
        from xla_dtensor.core.executor import sync
        sync()
    spec = _A.get_spec(plain)
    if spec is None or spec.is_replicated:
        return ""
    return str(spec.reduced().on_root().to_hlo())


def sharding_type_of(hlo: str) -> ShardingType | None:
    """The :class:`ShardingType` of an HLO sharding string (``None`` for ``''``)."""
    if not hlo:
        return None
    h = HloSharding.parse(hlo)
    if h.is_maximal:
        return ShardingType.MAXIMAL
    if h.is_replicated:
        return ShardingType.REPLICATED
    return ShardingType.PARTIAL if h.replicas > 1 else ShardingType.TILED


@dataclass
class ShardingSpec:
    """A reusable ``(mesh, partition_spec)`` annotation; ``minibatch=True`` (input loading)
    means each process loaded its own part of the batch (one process: the whole batch).

    Example:
        >>> import torch, xla_dtensor
        >>> spec = ShardingSpec(Mesh(range(8), (8,), ("data",)), ("data", None))
        >>> spec.can_apply(torch.zeros(2)), spec.can_apply(torch.zeros(8, 2))
        (False, True)
    """

    mesh: Any
    partition_spec: tuple[Any, ...]
    minibatch: bool = False

    def can_apply(self, t: torch.Tensor) -> bool:
        """Whether the spec has one entry per dim of ``t``."""
        return len(t.shape) == len(self.partition_spec)

    def apply(self, t: torch.Tensor) -> None:
        """``mark_sharding(t, mesh, partition_spec)``."""
        mark_sharding(t, self.mesh, self.partition_spec)

    def spec_for(self, ndim: int) -> _Spec:
        """This spec as a :class:`xla_dtensor.sharding.ShardingSpec` for a tensor of ``ndim`` dims."""
        with assertion(RankError):
            return _Spec.from_partition_spec(_resolve_mesh(self.mesh), tuple(self.partition_spec), ndim=ndim)


def dynamo_mark_sharding(t: torch.Tensor, device_ids: Sequence[int], mesh_shape: Sequence[int],
                         axis_names: Any, partition_spec: Any) -> XLAShardedTensor:
    """torch_xla's dynamo-traceable ``mark_sharding`` (axis names and spec may be given as
    their ``str`` forms). Under ``torch.compile`` annotate the tensors before the call:
    the compiled program keeps their layouts.

    Example:
        >>> import torch, xla_dtensor
        >>> t = torch.zeros(8).to(xla_dtensor.device())
        >>> dynamo_mark_sharding(t, list(range(8)), [8], "('x',)", "('x',)").sharding_spec
        '{devices=[8]<=[8]}'
    """
    names = ast.literal_eval(axis_names) if isinstance(axis_names, str) else axis_names
    spec = ast.literal_eval(partition_spec) if isinstance(partition_spec, str) else partition_spec
    return mark_sharding(t, Mesh(list(device_ids), tuple(mesh_shape), names), tuple(spec))
