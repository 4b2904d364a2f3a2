"""torch_xla's ``Mesh`` / ``HybridMesh``: :class:`mesh.Mesh` with torch_xla's constructor
errors (``AssertionError``), ``get_axis_name_idx`` returning ``None`` for an unknown
name, ``get_op_sharding``, and ``HybridMesh``'s ``dcn_mesh_shape`` defaulting to all ones.

Example:
    >>> m = Mesh(range(8), (2, 4), ("x", "y"))
    >>> m.get_logical_mesh().tolist()
    [[0, 1, 2, 3], [4, 5, 6, 7]]
    >>> str(m.get_op_sharding(("y", None)))
    '{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}'
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

import mesh as _mesh
from mesh.errors import MeshError
from xla_dtensor.compat.torch_xla.distributed.spmd._errors import assertion
from xla_dtensor.sharding import HloSharding, ShardingError, ShardingSpec
from xla_dtensor.sharding.errors import RankError

__all__ = ["HybridMesh", "Mesh", "get_1d_mesh", "get_global_mesh", "set_global_mesh"]


class Mesh(_mesh.Mesh):
    """A device mesh built as torch_xla builds it; see the module doc.

    Raises:
        AssertionError: (also a :class:`mesh.MeshError`) the ids do not fill ``mesh_shape``,
            repeat, or the names do not match the axes.
    """

    __slots__ = ()

    def __init__(self, device_ids: Sequence[int] | np.ndarray, mesh_shape: Sequence[int],
                 axis_names: Sequence[str] | None = None, **kwargs: Any) -> None:
        with assertion(MeshError):
            super().__init__(device_ids, mesh_shape, axis_names, **kwargs)

    def get_axis_name_idx(self, name: str) -> int | None:  # type: ignore[override]
        """The index of axis ``name``, or ``None`` when the mesh has no such axis."""
        return self.axis_names.index(name) if self.axis_names and name in self.axis_names else None

    def get_op_sharding(self, partition_spec: Sequence[Any]) -> HloSharding:
        """The HLO sharding ``partition_spec`` means on this mesh (one entry per tensor dim).

        Raises:
            ValueError: an axis name the mesh does not have. AssertionError: an axis used twice.
        """
        spec = tuple(partition_spec)
        if not spec:
            return HloSharding.parse("{replicated}")
        with assertion(RankError):
            return ShardingSpec.from_partition_spec(self, spec, ndim=len(spec)).reduced().to_hlo()


class HybridMesh(_mesh.HybridMesh, Mesh):
    """torch_xla's ``HybridMesh(ici_mesh_shape=, dcn_mesh_shape=None, axis_names=None)``.

    ``dcn_mesh_shape`` defaults to all ones (one granule: a single slice or host).

    Example:
        >>> HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model")).shape()
        OrderedDict([('data', 2), ('model', 4)])
    """

    __slots__ = ()

    def __init__(self, *, ici_mesh_shape: Sequence[int], dcn_mesh_shape: Sequence[int] | None = None,
                 axis_names: Sequence[str] | None = None, **kwargs: Any) -> None:
        dcn = tuple(dcn_mesh_shape) if dcn_mesh_shape is not None else (1,) * len(tuple(ici_mesh_shape))
        if "num_granules" not in kwargs and int(np.prod(dcn)) > 1 and "devices" not in kwargs:
            kwargs["num_granules"] = int(np.prod(dcn))  # NOTE: virtual/one-process devices have one granule
        with assertion(MeshError, ShardingError):
            _mesh.HybridMesh.__init__(self, ici_mesh_shape=ici_mesh_shape, dcn_mesh_shape=dcn,
                                      axis_names=axis_names, **kwargs)


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """All devices on one axis, in id order.

    Example:
        >>> get_1d_mesh("data").mesh_shape
        (8,)
    """
    import jax
    ids = sorted(d.id for d in jax.devices())
    return Mesh(ids, (len(ids),), (axis_name,) if axis_name else None)


def set_global_mesh(mesh: _mesh.Mesh | None) -> None:
    """The mesh APIs use when given none (:func:`mesh.set_global_mesh`)."""
    _mesh.set_global_mesh(mesh)


def get_global_mesh() -> _mesh.Mesh | None:
    return _mesh.get_global_mesh()
