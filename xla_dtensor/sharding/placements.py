"""DTensor placements <-> :class:`ShardingSpec`.

DTensor gives one placement per mesh axis: ``Shard(d)`` (split tensor dim ``d``),
``Replicate()``, or ``Partial(op)`` (a pending reduction). When several mesh axes
shard the same tensor dim, DTensor splits in mesh-axis order: the lower mesh axis
is the major one, exactly the torch_xla spec ``((a, b),)`` for mesh axes ``a < b``.
A minor-first order needs ``_StridedShard``, which is rejected.
"""
from __future__ import annotations

from typing import Any, Sequence

from mesh import Mesh

from xla_dtensor.sharding.errors import NotExpressibleError, PlacementError, RankError, SpecTypeError
from xla_dtensor.sharding.spec import ShardingSpec


def _placement_types() -> tuple[type, type, type, type]:
    from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

    return Shard, Replicate, Partial, _StridedShard


def spec_from_placements(mesh: Mesh, placements: Sequence[Any], ndim: int) -> ShardingSpec:
    """Build a spec from DTensor placements, one per mesh axis.

    Args:
        mesh: the mesh; ``placements[i]`` describes mesh axis ``i``.
        placements: ``Shard(d)`` (``d`` may be negative), ``Replicate()`` or ``Partial(op)``.
        ndim: the tensor's rank.

    Example:
        >>> from mesh import Mesh
        >>> from torch.distributed.tensor.placement_types import Replicate, Shard
        >>> m = Mesh(range(8), (2, 4), ("dp", "tp"))
        >>> spec_from_placements(m, [Shard(0), Shard(0)], 2).to_partition_spec()
        (('dp', 'tp'), None)
    """
    Shard, Replicate, Partial, StridedShard = _placement_types()
    if isinstance(placements, (str, bytes)) or not isinstance(placements, Sequence):
        raise SpecTypeError(f"placements must be a sequence with one placement per mesh axis, got "
                            f"{placements!r}")
    if len(placements) != mesh.ndim:
        raise RankError(f"{len(placements)} placements {list(placements)} for a {mesh.ndim}-D mesh "
                        f"with axes {list(mesh.shape())}; give exactly one per mesh axis")
    if not isinstance(ndim, int) or ndim < 0:
        raise SpecTypeError(f"ndim must be a non-negative int, got {ndim!r}")
    dims: list[list[int]] = [[] for _ in range(ndim)]
    partial: list[tuple[int, str]] = []
    for axis, p in enumerate(placements):
        if isinstance(p, StridedShard):
            raise PlacementError(
                f"mesh axis {mesh.axis_name(axis)!r}: {p!r} (_StridedShard) is not supported; it "
                "describes a minor-first split that only arises inside FSDP2+TP bookkeeping. Use "
                "Shard/Replicate placements, or a torch_xla partition spec such as (('tp', 'dp'),) "
                "to put mesh axes on one tensor dim in a chosen order")
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            if not 0 <= d < ndim:
                raise PlacementError(f"mesh axis {mesh.axis_name(axis)!r}: {p!r} shards dim {p.dim} "
                                     f"but the tensor has rank {ndim} (allowed dims "
                                     f"{-ndim}..{ndim - 1})")
            dims[d].append(axis)
        elif isinstance(p, Partial):
            partial.append((axis, p.reduce_op))
        elif not isinstance(p, Replicate):
            raise SpecTypeError(f"mesh axis {mesh.axis_name(axis)!r}: {p!r} is not a DTensor "
                                "placement; allowed: Shard(d), Replicate(), Partial(op)")
    return ShardingSpec(mesh, tuple(tuple(d) for d in dims), tuple(partial))


def spec_to_placements(spec: ShardingSpec) -> tuple[Any, ...]:
    """DTensor placements for ``spec``, one per mesh axis.

    Raises:
        NotExpressibleError: a tensor dim is split by mesh axes in other than mesh-axis
            order (DTensor would need ``_StridedShard``).

    Example:
        >>> from mesh import Mesh
        >>> m = Mesh(range(8), (2, 4), ("dp", "tp"))
        >>> spec_to_placements(ShardingSpec(m, ((), ("tp",))))
        (Replicate(), Shard(dim=1))
    """
    Shard, Replicate, Partial, _ = _placement_types()
    out: list[Any] = [Replicate()] * spec.mesh.ndim
    for d, axes in enumerate(spec.dim_axes):
        if list(axes) != sorted(axes):
            names = [spec.mesh.axis_name(a) for a in axes]
            ordered = [spec.mesh.axis_name(a) for a in sorted(axes)]
            raise NotExpressibleError(
                f"tensor dim {d} is split by mesh axes {names} (major first); DTensor placements "
                f"split one dim in mesh-axis order only ({ordered}). "
                "Use the torch_xla partition spec or HLO form for this layout")
        for a in axes:
            out[a] = Shard(d)
    for a, op in spec.partial:
        out[a] = Partial(op)
    return tuple(out)
