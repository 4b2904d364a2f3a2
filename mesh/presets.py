"""Topology presets for real systems; each figure names its source.

Bandwidths are per device and per mesh-axis direction, the rate a ring collective
along one axis sees. Latencies are typical collective start-up times.
"""
from __future__ import annotations

from dataclasses import dataclass

from mesh.errors import TopologyError
from mesh.mesh import Mesh
from mesh.topology import DeviceSpec, Link, Topology

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class SystemPreset:
    """A device plus its fast (inside a granule) and slow (across granules) links."""

    device: DeviceSpec
    fast: Link
    slow: Link


PRESETS: dict[str, SystemPreset] = {
    # TPU v4: 275 TFLOP/s bf16, 1,228 GB/s HBM, 32 GiB; ICI 2,400 Gbps per chip over 6
    # links of a 3-D torus -> ~100 GB/s per axis (cloud.google.com/tpu/docs/v4).
    # DCN: ~200 Gbps per 4-chip host -> ~6 GB/s per chip (multislice docs).
    "tpu-v4": SystemPreset(
        DeviceSpec("TPU v4", 275e12, 1228e9, 32 * GiB),
        Link.from_bandwidth("ici", 1e-6, 100), Link.from_bandwidth("dcn", 2e-5, 6.25)),
    # TPU v5e: 197 TFLOP/s bf16, 819 GB/s HBM, 16 GiB; ICI 1,600 Gbps per chip over a
    # 2-D torus -> ~100 GB/s per axis direction (cloud.google.com/tpu/docs/v5e);
    # DCN about 3 GB/s per chip (design/AUTOSHARD.md).
    "tpu-v5e": SystemPreset(
        DeviceSpec("TPU v5e", 197e12, 819e9, 16 * GiB),
        Link.from_bandwidth("ici", 1e-6, 100), Link.from_bandwidth("dcn", 2e-5, 3)),
    # TPU v5p: 459 TFLOP/s bf16, 2,765 GB/s HBM, 95 GiB; ICI 4,800 Gbps per chip over 6
    # links -> ~200 GB/s per axis (cloud.google.com/tpu/docs/v5p); DCN ~6 GB/s per chip.
    "tpu-v5p": SystemPreset(
        DeviceSpec("TPU v5p", 459e12, 2765e9, 95 * GiB),
        Link.from_bandwidth("ici", 1e-6, 200), Link.from_bandwidth("dcn", 2e-5, 6.25)),
    # H100 SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3, 80 GB (NVIDIA H100 datasheet);
    # NVLink 4: 900 GB/s bidirectional = 450 GB/s per direction; InfiniBand NDR
    # 400 Gb/s per GPU = 50 GB/s (DGX H100 reference architecture). NCCL latencies.
    "h100": SystemPreset(
        DeviceSpec("H100 SXM", 989e12, 3.35e12, 80e9),
        Link.from_bandwidth("nvlink", 5e-6, 450), Link.from_bandwidth("infiniband", 1e-5, 50)),
    # 8 virtual CPU devices sharing the 2 cores of the development machine, measured by
    # benchmarks/calibrate_cpu.py (results/calibrate_cpu.md): all-reduce fit alpha 0.30 ms,
    # 1.8 GB/s; 27 GFLOP/s matmul and 1-2 GB/s memory per device with all 8 busy.
    # Collectives between virtual devices are latency-bound: plans favour few of them.
    "cpu": SystemPreset(
        DeviceSpec("virtual CPU", 25e9, 1.5e9, 3 * GiB),
        Link.from_bandwidth("host", 3e-4, 1.8), Link.from_bandwidth("host", 3e-4, 1.8)),
}


def topology_for(mesh: Mesh, preset: str = "tpu-v5e") -> Topology:
    """Topology of ``mesh`` on the system ``preset`` (one of :data:`PRESETS`).

    Axes of a :class:`mesh.HybridMesh` that cross granules get the slow link; every
    axis of a plain :class:`Mesh` gets the fast one.

    Example:
        >>> topology_for(Mesh(range(8), (2, 4), ("data", "model")), "h100").links[0].kind
        'nvlink'
    """
    try:
        system = PRESETS[preset]
    except KeyError:
        raise TopologyError(f"unknown topology preset {preset!r}; allowed: {sorted(PRESETS)}") from None
    kinds = getattr(mesh, "axis_kind", None)
    links = tuple(system.slow if kinds and kinds(i) in ("dcn", "ici+dcn") else system.fast
                  for i in range(mesh.ndim))
    return Topology(mesh.jax_axis_names, mesh.mesh_shape, links, system.device, preset)
