"""``torch.distributed.DeviceMesh("xla", ...)`` -> :class:`mesh.Mesh`, sub-meshes included.

A mesh torch sliced (``dm["tp"]``, ``dm["dp", "tp"]``) or flattened (``dm._flatten()``)
keeps a reference to its root; the result here is the matching sub-mesh of the root
:class:`Mesh` (see :meth:`Mesh.__getitem__`, :meth:`Mesh.flatten`), so a placement on it
means "replicated along the root's other axes", as in DTensor. Which root axes each
sub-mesh axis spans is read from the device ids, not from torch's private layout.
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
    if root_dm is None or root_dm is device_mesh:
        ids = np.asarray(_grid(device_mesh))
        return Mesh(ids.reshape(-1), ids.shape, device_mesh.mesh_dim_names)
    root = from_torch(root_dm)
    block = np.asarray(_grid(device_mesh))
    names = device_mesh.mesh_dim_names or tuple(f"dim{i}" for i in range(block.ndim))
    groups = tuple(_spanned_root_axes(root, block, j, names[j]) for j in range(block.ndim))
    sub = Mesh(block.reshape(-1), block.shape, names)
    sub._parent, sub._parent_axes = root, groups
    return sub


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
