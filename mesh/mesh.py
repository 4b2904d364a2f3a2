"""The logical device mesh: device ids arranged in an N-D grid with named axes.

Semantics follow the torch_xla SPMD ``Mesh``: ``device_ids`` are global device ids
(JAX's ``Device.id``) laid out row-major into ``mesh_shape``. A mesh checks its ids
against ``jax.devices()`` when built (``validate=False``: a mesh of another machine,
for planning).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any, Hashable, Sequence

import numpy as np

from mesh._devices import check_device_ids
from mesh.errors import AxisError, DeviceIdError, MeshShapeError

if TYPE_CHECKING:  # pragma: no cover
    import jax

AxisRef = "str | int"


class Mesh:
    """A logical N-D mesh of devices with optional axis names.

    Args:
        device_ids: global device ids, in the order they fill the mesh (row-major).
        mesh_shape: size of each mesh axis; the product must equal ``len(device_ids)``.
        axis_names: one unique name per axis, or ``None`` (axes are then known by index).
        validate: check that JAX has every device id (this starts JAX's backends). Pass
            ``False`` to describe another machine's mesh, e.g. to plan for 256 TPU chips.

    Raises:
        MeshShapeError, DeviceIdError, AxisError: a malformed shape, id list or names.
        MeshDevicesError: ``validate`` and some id is not one of ``jax.devices()``.

    Example:
        >>> m = Mesh(range(8), (2, 4), ("data", "model"))
        >>> m.shape()
        OrderedDict([('data', 2), ('model', 4)])
        >>> m["model"].get_logical_mesh().tolist()
        [0, 1, 2, 3]
    """

    __slots__ = ("device_ids", "mesh_shape", "axis_names", "_parent", "_parent_axes")

    def __init__(
        self,
        device_ids: Sequence[int] | np.ndarray,
        mesh_shape: Sequence[int],
        axis_names: Sequence[str] | None = None,
        *,
        validate: bool = True,
    ) -> None:
        self.mesh_shape: tuple[int, ...] = _check_shape(mesh_shape)
        self.device_ids: tuple[int, ...] = _check_ids(device_ids, self.mesh_shape)
        self.axis_names: tuple[str, ...] | None = _check_names(axis_names, len(self.mesh_shape))
        self._parent: Mesh | None = None
        self._parent_axes: tuple[tuple[int, ...], ...] = ()  # per axis: the root axes it spans
        if validate:
            check_device_ids(self.device_ids, f"{type(self).__name__}({self._axes_text()})")

    # -- torch_xla-compatible accessors ------------------------------------------------
    def size(self) -> int:
        """Number of devices in the mesh."""
        return len(self.device_ids)

    def shape(self) -> OrderedDict[Hashable, int]:
        """Axis name (or index when unnamed) -> axis size, in axis order."""
        keys = self.axis_names or range(len(self.mesh_shape))
        return OrderedDict(zip(keys, self.mesh_shape))

    def get_logical_mesh(self) -> np.ndarray:
        """The device ids as an array of shape ``mesh_shape``."""
        return np.asarray(self.device_ids, dtype=np.int64).reshape(self.mesh_shape)

    def get_axis_name_idx(self, name: str) -> int:
        """Index of the axis called ``name`` (torch_xla spelling of :meth:`axis_index`)."""
        return self.axis_index(name)

    @property
    def ndim(self) -> int:
        return len(self.mesh_shape)

    def axis_index(self, axis: str | int) -> int:
        """Resolve an axis given by name or (possibly negative) index to its index."""
        if isinstance(axis, (int, np.integer)) and not isinstance(axis, bool):
            if -self.ndim <= axis < self.ndim:
                return int(axis) % self.ndim
            raise AxisError(f"mesh axis index {axis} out of range for a {self.ndim}-D mesh "
                            f"(allowed: {-self.ndim}..{self.ndim - 1})")
        if isinstance(axis, str) and self.axis_names and axis in self.axis_names:
            return self.axis_names.index(axis)
        if isinstance(axis, str) and not self.axis_names and axis in self.jax_axis_names:
            return self.jax_axis_names.index(axis)  # "dim{i}" names the axis of an unnamed mesh
        raise AxisError(f"unknown mesh axis {axis!r}; this mesh has axes "
                        f"{list(self.axis_names or range(self.ndim))}")

    def axis_size(self, axis: str | int) -> int:
        return self.mesh_shape[self.axis_index(axis)]

    def axis_name(self, axis: str | int) -> str:
        """The axis's name, or ``"dim{i}"`` for an unnamed mesh (the JAX mesh's name)."""
        i = self.axis_index(axis)
        return self.axis_names[i] if self.axis_names else f"dim{i}"

    @property
    def jax_axis_names(self) -> tuple[str, ...]:
        return self.axis_names or tuple(f"dim{i}" for i in range(self.ndim))

    # -- sub-meshes ----------------------------------------------------------------
    def __getitem__(self, axes: str | Sequence[str]) -> Mesh:
        """Sub-mesh over some named axes, like torch's ``device_mesh["tp"]``.

        Under SPMD every group along the other axes acts alike, so the sub-mesh holds
        the group containing device ``device_ids[0]`` and remembers its parent: a
        placement on the sub-mesh means "replicated along the parent's other axes".
        """
        names = (axes,) if isinstance(axes, str) else tuple(axes)
        idx = tuple(self.axis_index(a) for a in names)
        if len(set(idx)) != len(idx):
            raise AxisError(f"sub-mesh axes {names!r} name one axis twice")
        grid = np.moveaxis(self.get_logical_mesh(), idx, range(len(idx)))
        block = grid[(Ellipsis,) + (0,) * (self.ndim - len(idx))] if len(idx) < self.ndim else grid
        groups = self.root_axis_groups
        return self._child(block, [self.axis_name(i) for i in idx], tuple(groups[i] for i in idx))

    def flatten(self, name: str | None = None) -> Mesh:
        """This mesh's devices as one axis (row-major), like torch's ``DeviceMesh._flatten``.

        The result remembers the root: its one axis spans all of this mesh's root axes,
        major first, so ``Shard(0)`` on it splits a dim over all of them.

        Example:
            >>> m = Mesh(range(8), (2, 2, 2), ("dp", "cp", "tp"))
            >>> f = m[("dp", "cp")].flatten()
            >>> f.axis_names, f.get_logical_mesh().tolist(), f.root_axis_groups
            (('dp_cp',), [0, 2, 4, 6], ((0, 1),))
        """
        name = name or "_".join(self.axis_names or self.jax_axis_names)
        spanned = tuple(a for g in self.root_axis_groups for a in g)
        return self._child(self.get_logical_mesh().reshape(-1), [name], (spanned,))

    def _child(self, block: np.ndarray, names: Sequence[str], groups: tuple[tuple[int, ...], ...]) -> Mesh:
        sub = Mesh(block.reshape(-1), block.shape, names, validate=False)
        sub._parent = self.root
        sub._parent_axes = groups
        return sub

    @property
    def root(self) -> Mesh:
        """The mesh this one was sliced from (itself when not a sub-mesh)."""
        return self._parent if self._parent is not None else self

    @property
    def root_axis_groups(self) -> tuple[tuple[int, ...], ...]:
        """For each axis of this mesh, the axes of :attr:`root` it spans, major first
        (one axis, or several for a flattened mesh)."""
        return self._parent_axes if self._parent is not None else tuple((i,) for i in range(self.ndim))

    @property
    def root_axes(self) -> tuple[int, ...]:
        """For each axis of this mesh, the index of the same axis in :attr:`root`.

        Raises:
            AxisError: an axis is a flattened one spanning several root axes (use
                :attr:`root_axis_groups`).
        """
        groups = self.root_axis_groups
        flat = [self.axis_name(i) for i, g in enumerate(groups) if len(g) != 1]
        if flat:
            raise AxisError(f"axes {flat} of {self!r} are flattened over several root axes; "
                            "read root_axis_groups instead")
        return tuple(g[0] for g in groups)

    # -- JAX ------------------------------------------------------------------------
    def devices(self) -> np.ndarray:
        """The JAX devices as an object array of shape ``mesh_shape``."""
        import jax

        check_device_ids(self.device_ids, repr(self))
        by_id = {d.id: d for d in jax.devices()}
        return np.array([by_id[i] for i in self.device_ids], dtype=object).reshape(self.mesh_shape)

    def jax_mesh(self) -> "jax.sharding.Mesh":
        """This mesh as a ``jax.sharding.Mesh`` with ``AxisType.Auto`` axes, same device order."""
        return _jax_mesh(self)

    # -- value semantics ---------------------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.device_ids, self.mesh_shape, self.axis_names)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def _axes_text(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.shape().items())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._axes_text()}; devices={list(self.device_ids)})"


_JAX_MESHES: dict[Mesh, Any] = {}


def _jax_mesh(m: Mesh) -> "jax.sharding.Mesh":
    cached = _JAX_MESHES.get(m)
    if cached is None:
        from jax.sharding import AxisType
        from jax.sharding import Mesh as JaxMesh

        cached = JaxMesh(m.devices(), m.jax_axis_names, axis_types=(AxisType.Auto,) * m.ndim)
        _JAX_MESHES[m] = cached
    return cached


def _check_shape(mesh_shape: Sequence[int]) -> tuple[int, ...]:
    try:
        shape = tuple(int(s) for s in mesh_shape)
    except (TypeError, ValueError):
        raise MeshShapeError(f"mesh_shape must be a sequence of ints, got {mesh_shape!r}") from None
    if not shape or any(s < 1 for s in shape):
        raise MeshShapeError(f"mesh_shape must be non-empty with sizes >= 1, got {shape}")
    return shape


def _check_ids(device_ids: Sequence[int] | np.ndarray, shape: tuple[int, ...]) -> tuple[int, ...]:
    ids = np.asarray(list(device_ids) if not isinstance(device_ids, np.ndarray) else device_ids)
    if ids.size and not np.issubdtype(ids.dtype, np.integer):
        raise DeviceIdError(f"device ids must be integers, got {device_ids!r}")
    flat = tuple(int(i) for i in ids.reshape(-1))
    if len(flat) != int(np.prod(shape)):
        raise MeshShapeError(f"mesh_shape {shape} holds {int(np.prod(shape))} devices but "
                             f"{len(flat)} device ids were given")
    seen: set[int] = set()
    dupes = sorted({i for i in flat if i in seen or seen.add(i)})  # type: ignore[func-returns-value]
    if dupes:
        raise DeviceIdError(f"device ids must be unique; duplicated: {dupes}")
    negative = [i for i in flat if i < 0]
    if negative:
        raise DeviceIdError(f"device ids must be >= 0, got {negative}")
    return flat


def _check_names(names: Sequence[str] | None, ndim: int) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, str):
        raise AxisError(f"axis_names must be a sequence of names, got the string {names!r}")
    out = tuple(names)
    if len(out) != ndim:
        raise AxisError(f"axis_names {out} has {len(out)} names for a {ndim}-D mesh")
    bad = [n for n in out if not isinstance(n, str) or not n]
    if bad:
        raise AxisError(f"axis names must be non-empty strings, got {bad}")
    dupes = sorted({n for n in out if out.count(n) > 1})
    if dupes:
        raise AxisError(f"axis name(s) {dupes} used more than once in {out}")
    return out


# -- global default mesh --------------------------------------------------------------
_GLOBAL_MESH: Mesh | None = None


def set_global_mesh(mesh: Mesh | None) -> None:
    """Set (or clear with ``None``) the mesh used when an API is given none.

    Example:
        >>> set_global_mesh(Mesh(range(8), (8,), ("data",)))
    """
    global _GLOBAL_MESH
    if mesh is not None and not isinstance(mesh, Mesh):
        raise TypeError(f"set_global_mesh expects a mesh.Mesh or None, got {type(mesh).__name__}")
    _GLOBAL_MESH = mesh


def get_global_mesh() -> Mesh | None:
    """The mesh set by :func:`set_global_mesh`, or ``None``."""
    return _GLOBAL_MESH
