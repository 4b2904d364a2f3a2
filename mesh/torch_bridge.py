"""``torch.distributed.DeviceMesh("xla", ...)`` -> :class:`mesh.Mesh`, sub-meshes included.

A mesh torch sliced (``dm["tp"]``, ``dm["dp", "tp"]``) or flattened (``dm._flatten()``)
keeps a reference to its root; the result here is the matching sub-mesh of the root
:class:`Mesh` (see :meth:`Mesh.__getitem__`, :meth:`Mesh.flatten`), so a placement on it
means "replicated along the root's other axes", as in DTensor. Which root axes each
sub-mesh axis spans is read from the device ids. A mesh torch unflattened from its root
(``world._unflatten(0, (2, 4), ("dp", "tp"))``, as torchtitan builds its meshes) covers
the root's devices and becomes a root of its own; a slice of it, whose axes cut the
root's axes, becomes a sub-mesh of a finer root over the same devices in the same
order, whose other axes are named ``_rest0``, ``_rest1``, ...
"""
from __future__ import annotations

from typing import Any

import numpy as np

from mesh.errors import AxisError
from mesh.mesh import Mesh


def from_torch(device_mesh: Any) -> Mesh:
    """Convert ``torch.distributed.DeviceMesh("xla", ...)`` keeping device order and dim names.

    Example:
        >>> from torch.distributed.device_mesh import DeviceMesh
        >>> from_torch(DeviceMesh("xla", [[0, 1], [2, 3]], mesh_dim_names=("dp", "tp"))).shape()
        OrderedDict([('dp', 2), ('tp', 2)])
    """
    if not hasattr(device_mesh, "device_type") or not hasattr(device_mesh, "mesh_dim_names"):
        raise TypeError(f"from_torch expects a torch DeviceMesh, got {type(device_mesh).__name__}")
    if device_mesh.device_type != "xla":
        raise TypeError(f"from_torch expects a DeviceMesh of device type 'xla', got "
                        f"{device_mesh.device_type!r}")
    root_dm = getattr(device_mesh, "_root_mesh", None)
    block = np.asarray(_grid(device_mesh))
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(block.ndim))
    if root_dm is None or root_dm is device_mesh:
        return Mesh(block.reshape(-1), block.shape, device_mesh.mesh_dim_names)
    root = from_torch(root_dm)
    if block.size == root.size() and block.ndim > 1 and _covers(device_mesh):
        return Mesh(block.reshape(-1), block.shape, names)  # an unflattened root: a root itself
    try:
        groups = tuple(_spanned_root_axes(root, block, j, names[j]) for j in range(block.ndim))
    except AxisError:  # axes cut out of a root axis (torch's _unflatten): a finer root
        root, groups = _refined_root(root, block, names)
    sub = Mesh(block.reshape(-1), block.shape, names)
    sub._parent, sub._parent_axes = root, groups
    return sub


def _covers(device_mesh: Any) -> bool:
    """Whether ``device_mesh`` is all of its root (one group), not one group of several."""
    layout = getattr(device_mesh, "_layout", None)
    return layout is None or layout.remap_to_tensor(device_mesh._rank_map).shape[0] == 1


def _refined_root(root: Mesh, block: np.ndarray, names: tuple[str, ...]) -> tuple[Mesh, tuple[tuple[int, ...], ...]]:
    """A root over ``root``'s devices, in ``root``'s order, whose axes are ``block``'s axes
    and the gaps between them (``_rest0``, ...), each a row-major stride of that order.

    The device order must stay the root's: one XLA program cannot mix layouts over the
    same devices in two orders. Raises :class:`AxisError` when ``block`` is no strided
    sub-grid of the root's order.
    """
    pos = {d: i for i, d in enumerate(root.device_ids)}
    base = pos[int(block.flat[0])]
    axes = []  # (stride, size, name): the sub-mesh's axes by their stride in the root's order
    for j, n in enumerate(block.shape):
        unit = tuple(1 if k == j else 0 for k in range(block.ndim))
        axes.append((pos[int(block[unit])] - base if n > 1 else 0, n, names[j]))
    atoms, reach = [], 1
    for stride, n, name in sorted(a for a in axes if a[1] > 1):
        if stride % reach:
            raise AxisError(f"sub-mesh axis {name!r} (stride {stride}) overlaps another axis in {root!r}")
        if stride > reach:
            atoms.append((reach, stride // reach, f"_rest{len(atoms)}"))
        atoms.append((stride, n, name))
        reach = stride * n
    if root.size() % reach:
        raise AxisError(f"sub-mesh {names} does not tile the {root.size()} devices of {root!r}")
    if root.size() > reach:
        atoms.append((reach, root.size() // reach, f"_rest{len(atoms)}"))
    atoms.sort(key=lambda a: -a[0])  # the largest stride is the major axis
    refined = Mesh(root.device_ids, [a[1] for a in atoms], [a[2] for a in atoms])
    order = [a[2] for a in atoms]
    return refined, tuple((order.index(name),) if n > 1 else () for _, n, name in axes)


def _grid(device_mesh: Any) -> Any:
    """The device ids of ``device_mesh`` (for a sub-mesh: the group holding its first id)."""
    layout, rank_map = getattr(device_mesh, "_layout", None), getattr(device_mesh, "_rank_map", None)
    if layout is not None and rank_map is not None:
        return layout.remap_to_tensor(rank_map)[0].tolist()
    return device_mesh.mesh.detach().cpu().tolist()


def _spanned_root_axes(root: Mesh, block: np.ndarray, j: int, name: str) -> tuple[int, ...]:
    """The root axes that axis ``j`` of ``block`` walks, major first.

    Raises:
        AxisError: the walk is not a row-major sweep of some root axes (no layout on the
            root mesh describes that sub-mesh axis).
    """
    where = {int(d): np.unravel_index(i, root.mesh_shape) for i, d in enumerate(root.device_ids)}
    line = np.moveaxis(block, j, 0)[(slice(None),) + (0,) * (block.ndim - 1)]
    coords = np.array([where[int(d)] for d in line])
    varying = [a for a in range(root.ndim) if len(set(coords[:, a])) > 1]
    major_first = sorted(varying, key=lambda a: -int(np.argmax(coords[:, a] != coords[0, a])))
    sizes = [root.mesh_shape[a] for a in major_first]
    want = np.array([coords[0]] * int(np.prod(sizes, dtype=int)))
    for k, idx in enumerate(np.ndindex(*sizes)):
        for a, i in zip(major_first, idx):
            want[k, a] = i
    if len(line) != len(want) or not np.array_equal(coords, want):
        raise AxisError(f"sub-mesh axis {name!r} walks devices {line.tolist()}, which is no "
                        f"row-major sweep of axes of the root mesh {root!r}")
    return tuple(major_first)


def slice_xla_mesh(device_mesh: Any, names: tuple[str, ...]) -> Any:
    """torch's own ``device_mesh[names]`` for an ``"xla"`` mesh (which has no process groups).

    Example:
        >>> from torch.distributed.device_mesh import DeviceMesh
        >>> dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("dp", "tp"))
        >>> slice_xla_mesh(dm, ("tp",)).mesh.tolist()
        [0, 1, 2, 3]
    """
    from torch.distributed.device_mesh import DeviceMesh
    root = device_mesh._get_root_mesh()
    added = [m for m in ((device_mesh,) if root is device_mesh else (device_mesh, root))
             if not hasattr(m, "_dim_group_names")]
    for m in added:
        m._dim_group_names = []  # NOTE: no groups to slice; torch only copies this list
    getitem = getattr(DeviceMesh.__getitem__, "__wrapped__", DeviceMesh.__getitem__)
    try:
        sub = getitem(device_mesh, names[0] if len(names) == 1 else names)
    finally:  # NOTE: torch's _unflatten would try to make process groups for a mesh that has the list
        for m in added:
            del m._dim_group_names
    if sub is not device_mesh and sub.__dict__.get("_dim_group_names") == []:
        del sub._dim_group_names
    return sub
