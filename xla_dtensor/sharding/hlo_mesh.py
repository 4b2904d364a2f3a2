""":class:`ShardingSpec` <-> :class:`HloSharding`: placing a tile assignment on mesh axes.

A spec becomes a tiling by transposing the mesh's device grid to (axes of dim 0,
axes of dim 1, ..., unused axes in mesh order) and reshaping it to the tile shape;
this is what JAX does for a ``NamedSharding``, so the strings match JAX's.

Going back needs a mesh. With ``mesh=None`` the mesh is the tile assignment itself
(one unnamed axis per cut tensor dim, then the replica axis), which always works.
With a given mesh, each mesh axis must move devices along exactly one tensor dim (or
within a replica group); otherwise the layout is not expressible on that mesh and
:class:`NotExpressibleError` says which devices break it.
"""
from __future__ import annotations

from math import prod

import numpy as np

from mesh import Mesh

from xla_dtensor.sharding.errors import NotExpressibleError, RankError
from xla_dtensor.sharding.hlo import HloSharding
from xla_dtensor.sharding.spec import ShardingSpec


def spec_to_hlo(spec: ShardingSpec) -> HloSharding:
    """The HLO sharding of ``spec`` (device numbers are device ids).

    Example:
        >>> from mesh import Mesh
        >>> m = Mesh(range(8), (2, 4), ("x", "y"))
        >>> str(spec_to_hlo(ShardingSpec(m, ((), ("y",)))))
        '{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}'
    """
    spec._require_no_partial("an HLO sharding")
    if spec.is_replicated:
        return HloSharding()
    order = [a for axes in spec.dim_axes for a in axes] + list(spec.replicated_axes)
    devices = spec.mesh.get_logical_mesh().transpose(order).reshape(-1)
    replicas = prod(spec.mesh.mesh_shape[a] for a in spec.replicated_axes)
    return HloSharding(spec.shard_counts, tuple(devices.tolist()), replicas)


def spec_from_hlo(sharding: str | HloSharding, mesh: Mesh | None = None,
                  ndim: int | None = None) -> ShardingSpec:
    """Place an HLO sharding on ``mesh`` (or on the mesh its tile assignment forms).

    Args:
        sharding: an HLO sharding string or :class:`HloSharding`.
        mesh: the mesh to express it on; ``None`` builds one from the tile assignment.
        ndim: the tensor's rank; required for ``{replicated}``, checked otherwise.

    Example:
        >>> from mesh import Mesh
        >>> m = Mesh(range(8), (2, 4), ("x", "y"))
        >>> spec_from_hlo("{devices=[4,2]<=[2,4]T(1,0)}", m).to_partition_spec()
        ('y', 'x')
        >>> spec_from_hlo("{devices=[4,2]<=[2,4]T(1,0)}").mesh.mesh_shape
        (4, 2)
    """
    h = HloSharding.parse(sharding) if isinstance(sharding, str) else sharding
    if h.is_maximal:
        raise NotExpressibleError(f"{h} puts the whole tensor on one device; it has no mesh "
                                  "layout. Use HloSharding directly (index ranges, visualization)")
    rank = h.ndim if h.is_tiled else ndim
    if rank is None:
        raise RankError(f"{h} fits any rank; pass ndim= to say the tensor's rank")
    if ndim is not None and ndim != rank:
        raise RankError(f"{h} tiles a rank-{rank} tensor but ndim={ndim} was given")
    if mesh is None:
        if not h.is_tiled:
            raise NotExpressibleError(f"{h} lists no devices; pass mesh= to say which devices hold it")
        return _spec_on_own_mesh(h)
    if not h.is_tiled:
        return ShardingSpec.replicated(mesh, rank)
    if sorted(h.devices) != sorted(mesh.device_ids):
        raise NotExpressibleError(f"{h} uses devices {sorted(h.devices)} but the mesh has "
                                  f"{sorted(mesh.device_ids)}")
    return _spec_on_mesh(h, mesh)


def _spec_on_own_mesh(h: HloSharding) -> ShardingSpec:
    dims = list(h.tile_shape) + [h.replicas]
    cut = [i for i, t in enumerate(dims) if t > 1]
    if not cut:
        return ShardingSpec(Mesh(h.devices, (1,)), ((),) * len(h.tile_shape))
    own = Mesh(h.devices, [dims[i] for i in cut])
    spec_axes = tuple((cut.index(d),) if d in cut else () for d in range(len(h.tile_shape)))
    return ShardingSpec(own, spec_axes)


def _spec_on_mesh(h: HloSharding, mesh: Mesh) -> ShardingSpec:
    tile_of = _tile_coords(h)
    grid = mesh.get_logical_mesh()
    origin = (0,) * mesh.ndim
    found: list[list[tuple[int, int]]] = [[] for _ in h.tile_shape]  # per dim: (stride, axis)
    for a, size in enumerate(mesh.mesh_shape):
        if size == 1:
            continue
        step = tuple(1 if i == a else 0 for i in range(mesh.ndim))
        t0, t1 = tile_of[int(grid[origin])], tile_of[int(grid[step])]
        moved = [d for d in range(len(t0)) if t0[d] != t1[d]]
        if len(moved) > 1:
            raise _not_on_mesh(h, mesh, f"one step along mesh axis {mesh.axis_name(a)!r} moves "
                                        f"device {grid[origin]} -> {grid[step]} across tensor dims "
                                        f"{moved}")
        if moved:
            found[moved[0]].append((t1[moved[0]] - t0[moved[0]], a))
    spec = ShardingSpec(mesh, tuple(tuple(a for _, a in sorted(f, reverse=True)) for f in found))
    mine = spec_to_hlo(spec)
    got = _tile_coords(mine) if mine.is_tiled else {d: (0,) * len(h.tile_shape) for d in h.devices}
    bad = [d for d in h.devices if got[d] != tile_of[d]]
    if bad:
        d = bad[0]
        raise _not_on_mesh(h, mesh, f"the closest mesh layout {spec.to_partition_spec()} puts "
                                    f"device {d} in tile {got[d]}, the string in tile {tile_of[d]} "
                                    f"({len(bad)} devices differ)")
    return spec


def _tile_coords(h: HloSharding) -> dict[int, tuple[int, ...]]:
    arr = h.device_array()
    return {int(arr[idx]): idx[:-1] for idx in np.ndindex(arr.shape)}


def _not_on_mesh(h: HloSharding, mesh: Mesh, why: str) -> NotExpressibleError:
    return NotExpressibleError(f"{h} is not expressible on {mesh!r}: {why}. Use mesh=None (the "
                               "mesh its tile assignment forms) or a mesh whose axes follow its "
                               "device order")
