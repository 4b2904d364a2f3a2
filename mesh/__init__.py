"""Device meshes and their interconnect topology.

Example:
    >>> from mesh import Mesh, HybridMesh, topology_for
    >>> m = Mesh(range(8), (2, 4), ("data", "model"))
    >>> topology_for(m, "tpu-v5e").all_reduce(4 << 20, "model") > 0
    True
"""
from __future__ import annotations

from mesh._env import ensure_virtual_cpu_devices

ensure_virtual_cpu_devices()

from mesh.errors import (  # noqa: E402
    AxisError, DeviceIdError, MeshDevicesError, MeshError, MeshShapeError, TopologyError,
)
from mesh.hybrid import HybridMesh, group_granules, hybrid_device_order  # noqa: E402
from mesh.mesh import Mesh, get_global_mesh, set_global_mesh  # noqa: E402
from mesh.torch_bridge import from_torch  # noqa: E402
from mesh.presets import PRESETS, SystemPreset, topology_for  # noqa: E402
from mesh.topology import COLLECTIVES, DeviceSpec, Link, Topology  # noqa: E402

__all__ = [
    "AxisError", "COLLECTIVES", "DeviceIdError", "DeviceSpec", "HybridMesh", "Link", "Mesh",
    "MeshDevicesError", "MeshError", "MeshShapeError", "PRESETS", "SystemPreset", "Topology", "TopologyError",
    "from_torch", "get_global_mesh", "group_granules", "hybrid_device_order", "set_global_mesh",
    "topology_for",
]
