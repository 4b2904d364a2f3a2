"""The terminal visualizer, read back from rich's recording console.

Each drawing is parsed into cells (box interiors); their device ids are compared with
the devices JAX assigns to each block (``devices_indices_map``) or with
``torch.chunk`` for uneven shapes, and their sizes with the shard sizes.
"""
from __future__ import annotations

import re

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
import pytest
import torch
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from rich.console import Console
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from mesh import HybridMesh, Mesh
from xla_dtensor.debug import render_sharding, visualize_sharding
from xla_dtensor.sharding import HloParseError, RankError, ShardingSpec, SpecTypeError
from xla_dtensor.visualize import main

M24 = Mesh(range(8), (2, 4), ("a", "b"))
M222 = Mesh(range(8), (2, 2, 2), ("a", "b", "c"))


def _draw(sharding, shape, mesh=None, width=80, **kw) -> tuple[str, Console]:
    console = Console(record=True, width=width, force_terminal=True, color_system="truecolor")
    visualize_sharding(sharding, shape, mesh, console=console, **kw)
    return console.export_text(styles=False), console


def _cells(text: str) -> list[list[dict]]:
    """Boxes of the grid: width/height of the interior and the device labels inside."""
    lines = text.splitlines()
    top = next(i for i, ln in enumerate(lines) if ln.startswith("┌"))
    cols = [i for i, ch in enumerate(lines[top]) if ch in "┌┬┐"]
    seps = [i for i, ln in enumerate(lines) if ln[:1] in ("├", "└") and i > top]
    out, start = [], top
    for sep in seps:
        row = []
        for a, b in zip(cols, cols[1:]):
            body = [ln[a + 1:b] for ln in lines[start + 1:sep]]
            row.append({"w": b - a - 1, "h": sep - start - 1,
                        "labels": " ".join(body).split()})
        out.append(row)
        start = sep
        if lines[sep].startswith("└"):
            break
    return out


def _ids(labels: list[str]) -> list[list[int]]:
    """Device ids per '|'-separated part (granule letters dropped)."""
    parts = " ".join(labels).split("|")
    return [[int(re.match(r"\d+", x).group()) for x in p.replace(",", " ").split()] for p in parts]


def _oracle(index_map: dict[int, tuple[tuple[int, int], ...]], shown: tuple[int, ...]):
    """Expected cells from a device -> ((start, stop), ...) map: [row][col] -> parts."""
    full = {d: s for d, s in index_map.items() if all(b > a for a, b in s)}
    rows = sorted({s[shown[0]] for s in full.values()}) if len(shown) == 2 else [None]
    cols = sorted({s[shown[-1]] for s in full.values()})
    hidden = [k for k in range(len(next(iter(full.values())))) if k not in shown]
    grid = []
    for r in rows:
        line = []
        for c in cols:
            members = [d for d, s in full.items()
                       if (r is None or s[shown[0]] == r) and s[shown[-1]] == c]
            parts: dict = {}
            for d in members:
                parts.setdefault(tuple(full[d][h] for h in hidden), []).append(d)
            line.append([sorted(parts[k]) for k in sorted(parts)])
        grid.append(line)
    return grid, rows, cols


def _jax_map(m: Mesh, pspec: P, shape: tuple[int, ...]) -> dict[int, tuple]:
    ns = NamedSharding(m.jax_mesh(), pspec)
    return {d.id: tuple(s.indices(n)[:2] for s, n in zip(idx, shape))
            for d, idx in ns.devices_indices_map(shape).items()}


def _assert_proportional(sizes: list[int], extents: list[int]) -> None:
    total = sum(sizes)
    for s, e in zip(sizes, extents):
        assert abs(s - e * total / sum(extents)) <= 1, (sizes, extents)


@pytest.mark.parametrize("text,m,pspec,shape", [
    ("{devices=[2,4]<=[8]}", M24, P("a", "b"), (16, 32)),
    ("{devices=[4,2]<=[2,4]T(1,0)}", M24, P("b", "a"), (8, 4)),
    ("{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}", M24, P(None, "b"), (6, 8)),
    ("{devices=[8]<=[8]}", M24, P(("a", "b")), (16,)),
    ("{devices=[2,2,2]<=[8]}", M222, P("a", "b", "c"), (4, 4, 4)),
    ("{devices=[2,1,2,2]<=[2,2,2]T(2,1,0)}", M222, P("c", None, "b", "a"), (4, 3, 2, 6)),
    ("{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}", M24, P("a"), (4, 4)),
])
def test_cells_hold_the_devices_jax_assigns(text, m, pspec, shape) -> None:
    drawn, _ = _draw(text, shape)
    shown = (0, 1) if len(shape) > 1 else (0,)
    want, rows, cols = _oracle(_jax_map(m, pspec, shape), shown)
    cells = _cells(drawn)
    assert [[_ids(c["labels"]) for c in row] for row in cells] == want
    _assert_proportional([c["w"] for c in cells[0]], [b - a for a, b in cols])
    if len(shape) > 1:
        _assert_proportional([row[0]["h"] for row in cells], [b - a for a, b in rows])
    assert sorted(d for row in want for c in row for p in c for d in p) == list(range(8))
    if len(shape) > 2:
        assert f"{len(shape)}-D tensor {shape}: showing dims 0 (rows) and 1 (columns)" in \
            " ".join(drawn.split())


@pytest.mark.parametrize("spec,shape", [(("a", "b"), (5, 7)), ((None, ("a", "b")), (3, 13)),
                                        (("b",), (5,)), (("b", None), (3, 2))])
def test_uneven_cells_follow_torch_chunk(spec, shape) -> None:
    s = ShardingSpec.from_partition_spec(M24, spec)
    drawn, _ = _draw(s, shape)
    # oracle: torch.chunk of an arange over the product of the axes on each dim
    t = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    index_map = {}
    grid = M24.get_logical_mesh()
    for coord in [(i, j) for i in range(2) for j in range(4)]:
        rng = []
        for d, axes in enumerate(s.dim_axes):
            k, i = 1, 0
            for a in axes:
                k, i = k * M24.mesh_shape[a], i * M24.mesh_shape[a] + coord[a]
            chunks = torch.chunk(torch.arange(shape[d]), k)
            rng.append((int(chunks[i][0]), int(chunks[i][-1]) + 1) if i < len(chunks) else
                       (shape[d], shape[d]))
        index_map[int(grid[coord])] = tuple(rng)
    shown = (0, 1) if len(shape) > 1 else (0,)
    want, rows, cols = _oracle(index_map, shown)
    cells = _cells(drawn)
    assert [[_ids(c["labels"]) for c in row] for row in cells] == want
    _assert_proportional([c["w"] for c in cells[0]], [b - a for a, b in cols])
    if len(shape) > 1:
        _assert_proportional([row[0]["h"] for row in cells], [b - a for a, b in rows])
    empty = sorted(d for d, r in index_map.items() if any(b == a for a, b in r))
    flat = " ".join(drawn.split())
    assert ("empty shards" in flat) == bool(empty) and "uneven" in flat
    del t


def test_replicated_and_maximal() -> None:
    drawn, _ = _draw("{replicated}", (4, 4), M24)
    (cell,), = _cells(drawn)
    assert _ids(cell["labels"]) == [list(range(8))]
    drawn, _ = _draw("{replicated}", (4, 4))
    assert " ".join(_cells(drawn)[0][0]["labels"]) == "all devices"
    drawn, _ = _draw("{maximal device=3}", (4, 6))
    (cell,), = _cells(drawn)
    assert _ids(cell["labels"]) == [[3]] and "the whole tensor is on device 3" in drawn


def test_hybrid_mesh_marks_granules() -> None:
    hm = HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 2), axis_names=("a", "b"),
                    num_granules=2)
    drawn, _ = _draw(ShardingSpec.from_partition_spec(hm, (None, "b", "a")), (2, 8, 4))
    seen = {}
    for row in _cells(drawn):
        for c in row:
            for lab in " ".join(c["labels"]).replace("|", " ").replace(",", " ").split():
                d, letter = re.fullmatch(r"(\d+)([a-z])", lab).groups()
                seen[int(d)] = letter
    assert seen == {d: "ab"[hm.granule_of(d)] for d in range(8)}
    assert "granules (letter after a device id): a = 0-3; b = 4-7" in " ".join(drawn.split())


def test_colours_one_per_device_group() -> None:
    text = render_sharding("{devices=[4,1,2]<=[8] last_tile_dim_replicate}", (4, 4), width=40)
    console = Console(width=40)
    lines = text.plain.splitlines()
    starts = [sum(len(ln) + 1 for ln in lines[:i]) for i in range(len(lines))]
    bgs: dict[str, set] = {}  # cell label -> background colours of every char inside
    label, seen = "", set()
    for i, ln in enumerate(lines):
        if ln.startswith(("├", "└")) and seen:
            bgs[label] = seen
            label, seen = "", set()
        if ln.startswith("│"):
            label += ln.strip("│ ")
            seen |= {text.get_style_at_offset(console, starts[i] + k).bgcolor
                     for k in range(1, len(ln) - 1)}
    assert sorted(bgs) == ["0,1", "2,3", "4,5", "6,7"]
    assert all(len(v) == 1 and None not in v for v in bgs.values())  # each cell filled
    assert len({next(iter(v)) for v in bgs.values()}) == 4  # one colour per group
    plain = render_sharding("{devices=[2,4]<=[8]}", (4, 4), width=40, color=False)
    assert not plain.spans


def test_inputs_placements_partition_spec_partial() -> None:
    a, _ = _draw([Shard(0), Replicate()], (4, 4), M24)
    b, _ = _draw(("a", None), (4, 4), M24)
    c, _ = _draw("{devices=[2,1,4]<=[8] last_tile_dim_replicate}", (4, 4))
    assert _cells(a) == _cells(b) == _cells(c)
    d, _ = _draw([Partial(), Shard(1)], (4, 8), M24)
    assert "partial: mesh axes {'a': 'sum'}" in " ".join(d.split())
    with pytest.raises(SpecTypeError, match="needs mesh="):
        render_sharding(("a", None), (4, 4))
    with pytest.raises(RankError, match="dims=.5, 0."):
        render_sharding("{devices=[2,4]<=[8]}", (4, 4), dims=(5, 0))
    with pytest.raises(HloParseError, match="need 8 devices"):
        render_sharding("{devices=[2,4]<=[4]}", (4, 4))


def test_dims_choose_the_drawn_dims() -> None:
    drawn, _ = _draw("{devices=[2,2,2]<=[8]}", (4, 6, 8), dims=(0, 2))
    want, _, _ = _oracle(_jax_map(M222, P("a", "b", "c"), (4, 6, 8)), (0, 2))
    assert [[_ids(c["labels"]) for c in row] for row in _cells(drawn)] == want


def test_command_line(capsys) -> None:
    assert main(["{devices=[2,4]<=[8]}", "--shape", "16,32", "--no-color", "--width", "60"]) == 0
    out = capsys.readouterr().out
    want, _, _ = _oracle(_jax_map(M24, P("a", "b"), (16, 32)), (0, 1))
    assert [[_ids(c["labels"]) for c in row] for row in _cells(out)] == want
    assert main(["('dp', None)", "--shape", "4,4", "--mesh", "2,4", "--names", "dp,tp",
                 "--dcn", "2,1", "--no-color"]) == 0
    assert "a = 0-3; b = 4-7" in " ".join(capsys.readouterr().out.split())
    with pytest.raises(SystemExit) as info:  # one line, exit code 2 (tests/reliability/test_cli_errors.py)
        main(["{devices=[2,4]<=[9]}", "--shape", "4,4"])
    assert info.value.code == 2 and "need 8 devices, got 9" in capsys.readouterr().err
