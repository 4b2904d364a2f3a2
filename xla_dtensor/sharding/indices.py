"""Which slice of a global tensor each device holds.

Uneven shapes follow DTensor's ``torch.chunk`` convention: a dim of size ``n`` cut
into ``k`` pieces gives piece ``i`` the rows ``[min(i*c, n), min((i+1)*c, n))`` with
``c = ceil(n / k)``, so the last pieces are shorter and may be empty. (The runtime
stores such a tensor padded to ``c * k`` rows; padding rows are never data.)

When several mesh axes cut one dim, the default (``nested=False``) cuts it once
into the product of their sizes, like XLA and torch_xla. DTensor's own
``[Shard(0), Shard(0)]`` instead chunks nested, axis by axis; ``nested=True`` gives
that. The two agree whenever every cut is even. An empty shard is always
``slice(n, n)`` (DTensor's offset for it).
"""
from __future__ import annotations

from math import prod
from typing import Sequence

import numpy as np

from xla_dtensor.sharding.errors import RankError, SpecTypeError
from xla_dtensor.sharding.hlo import HloSharding
from xla_dtensor.sharding.spec import ShardingSpec

Index = tuple[slice, ...]


def chunk_range(size: int, pieces: int, i: int) -> tuple[int, int]:
    """Rows ``[start, stop)`` of piece ``i`` when ``size`` rows are cut like ``torch.chunk``.

    Example:
        >>> [chunk_range(5, 4, i) for i in range(4)]
        [(0, 2), (2, 4), (4, 5), (5, 5)]
    """
    c = -(-size // pieces) if size else 0
    return min(i * c, size), min((i + 1) * c, size)


def shard_indices(sharding: ShardingSpec | HloSharding | str, shape: Sequence[int], *,
                  device_ids: Sequence[int] | None = None, nested: bool = False) -> dict[int, Index]:
    """Map each device id to the slices of the global tensor it holds.

    Args:
        sharding: a :class:`ShardingSpec`, :class:`HloSharding` or HLO string.
        shape: the global shape.
        device_ids: devices holding a ``{replicated}`` HLO sharding (which lists none).
        nested: chunk a dim cut by several mesh axes axis by axis, like DTensor.

    Returns:
        ``{device_id: (slice(start, stop), ...)}``; ``x[idx]`` is that device's shard.
        A maximal sharding maps only its device.

    Example:
        >>> from mesh import Mesh
        >>> m = Mesh(range(4), (4,), ("x",))
        >>> shard_indices(ShardingSpec(m, (("x",),)), (5,))[3]
        (slice(5, 5, None),)
    """
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise SpecTypeError(f"shape {shape} has negative sizes")
    if isinstance(sharding, str):
        sharding = HloSharding.parse(sharding)
    if isinstance(sharding, ShardingSpec):
        return _spec_indices(sharding, shape, nested)
    if isinstance(sharding, HloSharding):
        return _hlo_indices(sharding, shape, device_ids)
    raise SpecTypeError(f"expected a ShardingSpec, HloSharding or HLO string, got "
                        f"{type(sharding).__name__}: {sharding!r}")


def _whole(shape: tuple[int, ...]) -> Index:
    return tuple(slice(0, s) for s in shape)


def _spec_indices(spec: ShardingSpec, shape: tuple[int, ...], nested: bool) -> dict[int, Index]:
    if len(shape) != spec.ndim:
        raise RankError(f"shape {shape} has rank {len(shape)} but the spec {spec!r} is for rank "
                        f"{spec.ndim}")
    grid, sizes = spec.mesh.get_logical_mesh(), spec.mesh.mesh_shape
    out: dict[int, Index] = {}
    for coord in np.ndindex(grid.shape):
        idx = []
        for n, axes in zip(shape, spec.dim_axes):
            if nested:
                start, stop = 0, n
                for a in axes:
                    lo, hi = chunk_range(stop - start, sizes[a], coord[a])
                    start, stop = start + lo, start + hi
                if start == stop:  # empty shards sit at the end, as in DTensor
                    start = stop = n
            else:
                i = 0
                for a in axes:
                    i = i * sizes[a] + coord[a]
                start, stop = chunk_range(n, prod(sizes[a] for a in axes), i)
            idx.append(slice(start, stop))
        out[int(grid[coord])] = tuple(idx)
    return out


def _hlo_indices(h: HloSharding, shape: tuple[int, ...],
                 device_ids: Sequence[int] | None) -> dict[int, Index]:
    if h.is_maximal:
        return {h.maximal_device: _whole(shape)}  # type: ignore[dict-item]
    if not h.is_tiled:
        if device_ids is None:
            raise SpecTypeError(f"{h} lists no devices; pass device_ids= to say which hold it")
        return {int(d): _whole(shape) for d in device_ids}
    if len(shape) != len(h.tile_shape):
        raise RankError(f"shape {shape} has rank {len(shape)} but {h} tiles rank "
                        f"{len(h.tile_shape)}")
    arr = h.device_array()
    return {int(arr[t]): tuple(slice(*chunk_range(n, k, i))
                               for n, k, i in zip(shape, h.tile_shape, t[:-1]))
            for t in np.ndindex(arr.shape)}
