"""The grid a sharding draws as: which devices fill which block of two shown tensor dims.

Pure data, no drawing: :mod:`xla_dtensor.debug.visualize` turns a :class:`Grid` into
text. Each device's shard is projected on the shown dims; devices with the same
projection share a cell, grouped into *parts* by their slices of the hidden dims
(devices in one part hold the same data: replicas).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from mesh import Mesh, get_global_mesh

from xla_dtensor.sharding import HloSharding, ShardingSpec, SpecTypeError, shard_indices
from xla_dtensor.sharding.errors import RankError

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class Cell:
    """One drawn block: rows/cols of the shown dims and its parts (replica groups)."""

    rows: Range
    cols: Range
    parts: tuple[tuple[int, ...], ...]  # device ids per hidden-dim part, in hidden-slice order

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(d for part in self.parts for d in part)


@dataclass(frozen=True, slots=True)
class Grid:
    """A sharding projected on (at most) two tensor dims, plus what the drawing must say."""

    shape: tuple[int, ...]
    shown: tuple[int, ...]          # tensor dims drawn: (rows, cols), (cols,) for 1-D, () for 0-D
    row_ranges: tuple[Range, ...]
    col_ranges: tuple[Range, ...]
    cells: tuple[tuple[Cell, ...], ...]  # [row][col]
    title: str
    notes: tuple[str, ...]
    granule_of: dict[int, int] | None   # device -> granule index for a HybridMesh


def build_grid(sharding: Any, shape: Sequence[int], mesh: Mesh | None = None,
               dims: Sequence[int] | None = None) -> Grid:
    """Resolve ``sharding`` and project its shards on ``dims`` (default: the first two).

    Args:
        sharding: a :class:`ShardingSpec`, :class:`HloSharding`, HLO string, torch_xla
            partition spec (needs a mesh), or DTensor placements (needs a mesh).
        shape: the global shape.
        mesh: the mesh for partition specs/placements; for HLO input it names granules
            and lists the holders of ``{replicated}`` (default: the global mesh).
        dims: which two tensor dims to draw (rows, cols).

    Example:
        >>> g = build_grid("{devices=[2,4]<=[8]}", (16, 32))
        >>> [c.devices for c in g.cells[1]]
        [(4,), (5,), (6,), (7,)]
    """
    shape = tuple(int(s) for s in shape)
    spec, hlo, mesh = _resolve(sharding, shape, mesh)
    notes: list[str] = []
    shown = _shown_dims(shape, dims, notes)
    layout = spec if spec is not None else hlo
    if spec is not None and spec.partial:
        names = {spec.mesh.axis_name(a): op for a, op in spec.partial}
        notes.append(f"partial: mesh axes {names} hold partial values pending a reduction; drawn "
                     "as the layout after it")
        layout = spec.reduced()
    holders = mesh.device_ids if mesh is not None else None
    if hlo is not None and hlo.is_replicated and not hlo.is_tiled and holders is None:
        holders = (-1,)  # no device list: one cell for "all devices"
    idx = shard_indices(layout, shape, device_ids=holders)
    if hlo is not None and hlo.is_maximal:
        notes.append(f"maximal: the whole tensor is on device {hlo.maximal_device}")
    _note_uneven(layout, shape, idx, notes)
    rows, cols, cells = _cells(idx, shape, shown)
    title = _title(spec, hlo, layout, shape)
    granules = None
    if mesh is not None and len(getattr(mesh, "granules", ())) > 1:
        granules = {d: g for g, members in enumerate(mesh.granules) for d in members}
        notes.append("HybridMesh granules (letter after a device id): " + "; ".join(
            f"{_letter(g)} = {_id_list(members)}" for g, members in enumerate(mesh.granules)))
    return Grid(shape, shown, rows, cols, cells, title, tuple(notes), granules)


def _letter(g: int) -> str:
    return chr(ord("a") + g) if g < 26 else f"g{g}"


def _id_list(ids: Sequence[int]) -> str:
    ids = sorted(ids)
    if ids and ids == list(range(ids[0], ids[-1] + 1)) and len(ids) > 2:
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def _resolve(sharding: Any, shape: tuple[int, ...], mesh: Mesh | None
             ) -> tuple[ShardingSpec | None, HloSharding | None, Mesh | None]:
    if isinstance(sharding, ShardingSpec):
        if mesh is not None and mesh != sharding.mesh:
            raise SpecTypeError(f"mesh={mesh!r} differs from the spec's mesh {sharding.mesh!r}")
        return sharding, None, sharding.mesh
    mesh = mesh if mesh is not None else get_global_mesh()
    if isinstance(sharding, str):
        sharding = HloSharding.parse(sharding)
    if isinstance(sharding, HloSharding):
        if mesh is not None and sharding.is_tiled and sorted(sharding.devices) != sorted(mesh.device_ids):
            mesh = None  # a different device set: the mesh says nothing about these devices
        return None, sharding, mesh
    if isinstance(sharding, (tuple, list)):
        if mesh is None:
            raise SpecTypeError(f"{sharding!r} needs mesh= (a partition spec or placements name "
                                "mesh axes)")
        if len(sharding) and all(type(p).__module__.startswith("torch.") for p in sharding):
            return ShardingSpec.from_placements(mesh, sharding, len(shape)), None, mesh
        return ShardingSpec.from_partition_spec(mesh, sharding, len(shape)), None, mesh
    raise SpecTypeError(f"cannot draw {type(sharding).__name__} {sharding!r}; give a ShardingSpec, "
                        "HloSharding, HLO string, partition spec or placements")


def _shown_dims(shape: tuple[int, ...], dims: Sequence[int] | None, notes: list[str]) -> tuple[int, ...]:
    rank = len(shape)
    if dims is None:
        shown = tuple(range(min(rank, 2)))
    else:
        shown = tuple(int(d) + rank if int(d) < 0 else int(d) for d in dims)
        if len(shown) != min(rank, 2) or len(set(shown)) != len(shown) or \
                any(not 0 <= d < rank for d in shown):
            raise RankError(f"dims={tuple(dims)} must name {min(rank, 2)} distinct dims of the "
                            f"rank-{rank} shape {shape}")
    hidden = [d for d in range(rank) if d not in shown]
    if hidden:
        notes.append(f"{rank}-D tensor {shape}: showing dims {shown[0]} (rows) and {shown[1]} "
                     f"(columns); dims {hidden} are not drawn. Devices holding different slices "
                     "of them share a cell, separated by '|' in slice order")
    return shown


def _note_uneven(layout: Any, shape: tuple[int, ...], idx: dict[int, tuple[slice, ...]],
                 notes: list[str]) -> None:
    for d, n in enumerate(shape):
        starts = sorted({(s[d].start, s[d].stop) for s in idx.values()})
        sizes = [stop - start for start, stop in starts]
        if len(set(sizes)) > 1:
            notes.append(f"uneven: dim {d} (size {n}) is cut into shards of sizes "
                         f"{', '.join(map(str, sizes))} (torch.chunk: full shards first, the "
                         "last ones shorter or empty)")
    empty = sorted(dev for dev, s in idx.items() if any(x.stop == x.start for x in s))
    if empty and not any(n == 0 for n in shape):
        many = len(empty) > 1
        notes.append(f"empty shards: device{'s' if many else ''} {_id_list(empty)} "
                     f"hold{'' if many else 's'} no elements (not drawn)")


def _cells(idx: dict[int, tuple[slice, ...]], shape: tuple[int, ...], shown: tuple[int, ...]
           ) -> tuple[tuple[Range, ...], tuple[Range, ...], tuple[tuple[Cell, ...], ...]]:
    full = {dev: s for dev, s in idx.items()
            if not any(x.stop == x.start for x in s) or any(n == 0 for n in shape)}
    hidden = [d for d in range(len(shape)) if d not in shown]

    axis = {0: shown[0] if len(shown) == 2 else None, 1: shown[-1] if shown else None}

    def span(dev: int, k: int) -> Range:  # k = 0 rows, 1 cols; a 1-D tensor is one row
        if axis[k] is None:
            return (0, 1)
        s = full[dev][axis[k]]
        return (s.start, s.stop)

    rows = tuple(sorted({span(d, 0) for d in full}))
    cols = tuple(sorted({span(d, 1) for d in full}))
    grid = []
    for r in rows:
        line = []
        for c in cols:
            members = [d for d in full if span(d, 0) == r and span(d, 1) == c]
            by_part: dict[tuple[int, ...], list[int]] = {}
            for d in members:
                by_part.setdefault(tuple(full[d][h].start for h in hidden), []).append(d)
            line.append(Cell(r, c, tuple(tuple(sorted(by_part[k])) for k in sorted(by_part))))
        grid.append(tuple(line))
    return rows, cols, tuple(grid)


def _title(spec: ShardingSpec | None, hlo: HloSharding | None, layout: Any,
           shape: tuple[int, ...]) -> str:
    if spec is None:
        return f"{hlo} on global shape {shape}"
    text = str(layout.to_hlo())
    pspec = layout.to_partition_spec()
    return f"{pspec} = {text} on global shape {shape}, mesh {dict(spec.mesh.shape())}"
