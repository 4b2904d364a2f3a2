"""HybridMesh: a mesh whose axes span fast links inside a granule (ICI) and slow ones across (DCN).

A granule is a TPU slice (``Device.slice_index``), else a process
(``Device.process_index``), else a declared number of equal chunks of the device
list (``num_granules=``) so multi-slice layouts can be simulated on virtual devices.
Axis ``i`` has size ``ici[i] * dcn[i]``; coordinate ``dcn_index * ici[i] + ici_index``,
the same order as ``jax.experimental.mesh_utils.create_hybrid_device_mesh``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Literal, Sequence

import numpy as np

from mesh.errors import MeshShapeError
from mesh.mesh import Mesh, _check_shape

if TYPE_CHECKING:  # pragma: no cover
    from mesh.topology import Topology

AxisKind = Literal["ici", "dcn", "ici+dcn", "trivial"]


class HybridMesh(Mesh):
    """A mesh with an ICI part inside each granule and a DCN part across granules.

    Args:
        ici_mesh_shape: the mesh shape inside one granule.
        dcn_mesh_shape: how granules are arranged; same rank as ``ici_mesh_shape``.
        axis_names: optional unique axis names.
        devices: JAX devices to use (default ``jax.devices()``).
        num_granules: simulate this many granules by splitting the device list into
            equal consecutive chunks (for virtual CPU devices, which have no slices).
        validate: check the ids of ``devices`` against ``jax.devices()`` (as :class:`Mesh`);
            ``False`` for another machine's devices, e.g. ids-only stand-ins when planning.

    Example:
        >>> m = HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1),
        ...                axis_names=("data", "fsdp", "tensor"), num_granules=2)
        >>> m.shape()
        OrderedDict([('data', 2), ('fsdp', 4), ('tensor', 1)])
        >>> m.axis_kinds()
        OrderedDict([('data', 'dcn'), ('fsdp', 'ici'), ('tensor', 'trivial')])
    """

    __slots__ = ("ici_mesh_shape", "dcn_mesh_shape", "granules")

    def __init__(
        self,
        *,
        ici_mesh_shape: Sequence[int],
        dcn_mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
        devices: Sequence[Any] | None = None,
        num_granules: int | None = None,
        validate: bool = True,
    ) -> None:
        ici, dcn = _check_shape(ici_mesh_shape), _check_shape(dcn_mesh_shape)
        if len(ici) != len(dcn):
            raise MeshShapeError(f"ici_mesh_shape {ici} and dcn_mesh_shape {dcn} must have the "
                                 "same number of axes")
        granules = group_granules(devices, num_granules)
        want = int(np.prod(dcn))
        if len(granules) != want:
            hint = (f"; on devices without slices or several processes, pass num_granules={want} "
                    "to simulate them") if len(granules) == 1 and num_granules is None else ""
            raise MeshShapeError(f"dcn_mesh_shape {dcn} needs {want} granules but the devices "
                                 f"form {len(granules)} (sizes {[len(g) for g in granules]}){hint}")
        per = int(np.prod(ici))
        bad = [len(g) for g in granules if len(g) != per]
        if bad:
            raise MeshShapeError(f"ici_mesh_shape {ici} needs {per} devices per granule, "
                                 f"granules have {[len(g) for g in granules]}")
        ids = hybrid_device_order(ici, dcn, granules)
        super().__init__(ids.reshape(-1), ids.shape, axis_names, validate=validate)
        self.ici_mesh_shape, self.dcn_mesh_shape = ici, dcn
        self.granules: tuple[tuple[int, ...], ...] = tuple(tuple(g) for g in granules)

    def axis_kind(self, axis: str | int) -> AxisKind:
        """``"ici"``, ``"dcn"``, ``"ici+dcn"`` (both parts > 1) or ``"trivial"`` (size 1)."""
        i = self.axis_index(axis)
        inner, outer = self.ici_mesh_shape[i] > 1, self.dcn_mesh_shape[i] > 1
        return {(True, True): "ici+dcn", (True, False): "ici",
                (False, True): "dcn", (False, False): "trivial"}[(inner, outer)]  # type: ignore[return-value]

    def axis_kinds(self) -> OrderedDict[Any, AxisKind]:
        return OrderedDict((k, self.axis_kind(i)) for i, k in enumerate(self.shape()))

    def granule_of(self, device_id: int) -> int:
        """Index of the granule holding ``device_id``."""
        for g, members in enumerate(self.granules):
            if device_id in members:
                return g
        raise KeyError(f"device {device_id} is not in this mesh")

    def topology(self, preset: str = "tpu-v5e") -> "Topology":
        """The :class:`mesh.Topology` of this mesh: DCN links on axes that cross granules."""
        from mesh.presets import topology_for

        return topology_for(self, preset)

    def _key(self) -> tuple[Any, ...]:
        return super()._key() + (self.ici_mesh_shape, self.dcn_mesh_shape)

    def __repr__(self) -> str:
        axes = ", ".join(f"{k}={v}[{self.axis_kind(i)}]" for i, (k, v) in enumerate(self.shape().items()))
        return f"HybridMesh({axes}; granules={[list(g) for g in self.granules]})"


def group_granules(devices: Sequence[Any] | None, num_granules: int | None) -> list[list[int]]:
    """Group device ids into granules by slice, else process, else ``num_granules`` chunks."""
    if devices is None:
        import jax

        devices = jax.devices()
    devices = list(devices)
    if num_granules is not None:
        if num_granules < 1 or len(devices) % num_granules:
            raise MeshShapeError(f"num_granules={num_granules} must be >= 1 and divide the "
                                 f"{len(devices)} devices")
        per = len(devices) // num_granules
        return [[d.id for d in devices[k * per:(k + 1) * per]] for k in range(num_granules)]
    # NOTE: CPU/GPU devices report slice_index 0 everywhere; then processes are the granules
    slices = {getattr(d, "slice_index", None) for d in devices}
    attr = "slice_index" if None not in slices and len(slices) > 1 else "process_index"
    groups: dict[int, list[int]] = {}
    for d in devices:
        groups.setdefault(getattr(d, attr), []).append(d.id)
    return [groups[k] for k in sorted(groups)]


def hybrid_device_order(ici: tuple[int, ...], dcn: tuple[int, ...],
                        granules: Sequence[Sequence[int]]) -> np.ndarray:
    """Device-id grid of shape ``ici * dcn``: granule ``g`` fills block ``unravel(g, dcn)``."""
    out = np.empty(tuple(a * b for a, b in zip(ici, dcn)), dtype=np.int64)
    for g, members in enumerate(granules):
        block = np.unravel_index(g, dcn)
        index = tuple(slice(b * n, (b + 1) * n) for b, n in zip(block, ici))
        out[index] = np.asarray(members, dtype=np.int64).reshape(ici)
    return out

