"""Uneven shapes: shards follow ``torch.chunk`` (DTensor's convention), checked against torch."""
from __future__ import annotations

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
import numpy as np
import pytest
import torch
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from mesh import Mesh
from xla_dtensor.sharding import ShardingSpec, chunk_range, shard_indices

M = Mesh(range(8), (2, 4), ("a", "b"))
M8 = Mesh(range(8), (8,), ("x",))


def _torch_chunk(t: torch.Tensor, pieces: int, dim: int, i: int) -> torch.Tensor:
    """DTensor's Shard(dim) over ``pieces`` devices: chunk i, or an empty trailing shard."""
    chunks = torch.chunk(t, pieces, dim)
    if i < len(chunks):
        return chunks[i]
    return t.narrow(dim, t.shape[dim], 0)


@pytest.mark.parametrize("size,pieces", [(5, 4), (1, 4), (7, 8), (9, 8), (13, 4), (0, 2), (3, 2)])
def test_chunk_range_is_torch_chunk(size: int, pieces: int) -> None:
    t = torch.arange(size)
    for i in range(pieces):
        lo, hi = chunk_range(size, pieces, i)
        assert torch.equal(t[lo:hi], _torch_chunk(t, pieces, 0, i))


@pytest.mark.parametrize("spec,shape", [
    (("a", "b"), (5, 7)),
    (("b", None), (6, 3)),
    ((None, "b"), (2, 3)),
    ((("a", "b"),), (13,)),
    ((("b", "a"), None), (10, 3)),
    (("b", None, "a"), (5, 2, 3)),
])
def test_flat_shards_are_torch_chunks(spec: tuple, shape: tuple[int, ...]) -> None:
    """Each device's shard is torch.chunk over the product of the axes splitting each dim."""
    s = ShardingSpec.from_partition_spec(M, spec, len(shape))
    t = torch.arange(int(np.prod(shape))).reshape(shape)
    grid = M.get_logical_mesh()
    got = shard_indices(s, shape)
    for coord in np.ndindex(grid.shape):
        want = t
        for d, axes in enumerate(s.dim_axes):
            i = 0
            for a in axes:
                i = i * M.mesh_shape[a] + coord[a]
            want = _torch_chunk(want, s.shard_counts[d], d, i)
        assert torch.equal(t[got[int(grid[coord])]], want)


@pytest.mark.parametrize("placements,shape", [
    ("SS0", (5, 3)), ("SS0", (13, 2)), ("SR", (3, 2)), ("RS1", (2, 6)), ("S0S1", (3, 5)),
])
def test_nested_shards_match_dtensor(placements: str, shape: tuple[int, ...]) -> None:
    from torch.distributed.tensor.placement_types import Replicate, Shard

    table = {"SS0": [Shard(0), Shard(0)], "SR": [Shard(0), Replicate()],
             "RS1": [Replicate(), Shard(1)], "S0S1": [Shard(0), Shard(1)]}
    pl = table[placements]
    s = ShardingSpec.from_placements(M, pl, len(shape))
    got = shard_indices(s, shape, nested=True)
    grid = M.get_logical_mesh()
    for coord in np.ndindex(grid.shape):
        size, off = _compute_local_shape_and_global_offset(shape, M.mesh_shape, list(coord), pl)
        assert tuple((x.start, x.stop) for x in got[int(grid[coord])]) == \
            tuple((o, o + n) for o, n in zip(off, size))


def test_nested_and_flat_differ_on_uneven_multi_axis_dims() -> None:
    s = ShardingSpec.from_partition_spec(M, (("a", "b"),))
    flat, nested = shard_indices(s, (5,)), shard_indices(s, (5,), nested=True)
    assert [flat[d][0].stop - flat[d][0].start for d in range(8)] == [1, 1, 1, 1, 1, 0, 0, 0]
    assert [nested[d][0].stop - nested[d][0].start for d in range(8)] == [1, 1, 1, 0, 1, 1, 0, 0]


def test_trailing_empty_shards() -> None:
    got = shard_indices(ShardingSpec(M8, (("x",),)), (3,))
    assert [got[d][0] for d in range(8)] == [slice(0, 1), slice(1, 2), slice(2, 3)] + \
        [slice(3, 3)] * 5
