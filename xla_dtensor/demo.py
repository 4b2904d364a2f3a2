"""The README's demo: ``python -m xla_dtensor.demo`` (``python3 dev.py demo``).

Shows the devices, a mesh and a multi-slice HybridMesh, what their links cost, one
layout written four ways, and the terminal visualizer.
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (virtual CPU devices before JAX starts)

import jax
from rich.console import Console
from rich.table import Table

from mesh import HybridMesh, Mesh, topology_for
from xla_dtensor.debug import visualize_sharding
from xla_dtensor.sharding import ShardingSpec

MiB = 1 << 20


def _section(console: Console, title: str) -> None:
    console.rule(f"[bold]{title}")


def show_meshes(console: Console) -> HybridMesh:
    _section(console, "Devices and meshes")
    devices = jax.devices()
    console.print(f"{len(devices)} JAX devices on platform {devices[0].platform!r}")
    flat = Mesh(range(8), (2, 4), ("data", "model"))
    hybrid = HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1),
                        axis_names=("data", "fsdp", "tensor"), num_granules=2)
    console.print(flat)
    console.print(hybrid)
    console.print(f"hybrid.shape() = {dict(hybrid.shape())}, axis kinds = {dict(hybrid.axis_kinds())}")
    return hybrid


def show_topology(console: Console, hybrid: HybridMesh) -> None:
    _section(console, "What a 64 MiB all-reduce costs on each axis (alpha-beta model)")
    table = Table("system", *(f"{name} ({kind})" for name, kind in hybrid.axis_kinds().items()
                              if hybrid.axis_size(name) > 1))
    for preset in ("tpu-v5e", "tpu-v5p", "h100"):
        topo = topology_for(hybrid, preset)
        table.add_row(preset, *(f"{topo.all_reduce(64 * MiB, name) * 1e3:.3f} ms"
                                for name in hybrid.shape() if hybrid.axis_size(name) > 1))
    console.print(table)


def show_specs(console: Console) -> None:
    _section(console, "One layout, four spellings")
    m = Mesh(range(8), (2, 4), ("data", "model"))
    table = Table("partition spec", "DTensor placements", "jax PartitionSpec", "HLO sharding")
    for pspec in [("data", "model"), (None, "model"), (("data", "model"), None), (None, None)]:
        spec = ShardingSpec.from_partition_spec(m, pspec)
        table.add_row(str(pspec), str(spec.to_placements()), str(spec.to_jax_pspec()), str(spec.to_hlo()))
    console.print(table)


def show_visualizer(console: Console, hybrid: HybridMesh) -> None:
    _section(console, "Shardings in the terminal")
    m = Mesh(range(8), (2, 4), ("data", "model"))
    visualize_sharding(("data", "model"), (16, 32), m, console=console)
    visualize_sharding("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", (10, 6), console=console)
    visualize_sharding(("data", "fsdp", None), (8, 16, 4), hybrid, console=console)


def main() -> None:
    console = Console()
    hybrid = show_meshes(console)
    show_topology(console, hybrid)
    show_specs(console)
    show_visualizer(console, hybrid)


if __name__ == "__main__":
    main()
