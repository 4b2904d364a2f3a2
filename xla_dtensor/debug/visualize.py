"""Draw a sharding in the terminal: one box per shard, sized like the shard, coloured per group.

Cells are proportional to the shard sizes (to within one character), list the
device ids holding them, and share a colour only when they hold the same
devices. Works for 0-D to N-D tensors (N-D: two dims shown, the rest listed in
each cell), replicated, partially replicated, maximal and uneven shardings, and
marks HybridMesh granules. Notes under the grid say what the picture cannot.
"""
from __future__ import annotations

import re
import textwrap
from typing import Any, Sequence

from rich.console import Console
from rich.style import Style
from rich.text import Text

from mesh import Mesh

from xla_dtensor.debug.layout import Cell, Grid, _letter, build_grid

# tab20-like backgrounds, strong and light alternating so neighbours differ
PALETTE = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896",
           "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7",
           "#bcbd22", "#dbdb8d", "#17becf", "#9edae5")
MAX_HEIGHT = 16  # interior lines of a 2-D grid, before labels force more


def visualize_sharding(sharding: Any, shape: Sequence[int], mesh: Mesh | None = None, *,
                       dims: Sequence[int] | None = None, width: int | None = None,
                       color: bool = True, console: Console | None = None) -> Text:
    """Print how ``sharding`` cuts a tensor of ``shape`` across devices, and return the drawing.

    Args:
        sharding: a :class:`~xla_dtensor.sharding.ShardingSpec`, an HLO sharding string or
            :class:`~xla_dtensor.sharding.HloSharding`, a torch_xla partition spec or DTensor
            placements (both with ``mesh``).
        shape: the global shape.
        mesh: the mesh (for partition specs/placements; for HLO input, to mark granules).
        dims: the two tensor dims to draw (default the first two).
        width: total width in characters (default the console's).
        color: colour the cells.
        console: where to print (default a new ``rich.console.Console``).

    Example:
        >>> from rich.console import Console
        >>> _ = visualize_sharding("{devices=[4]<=[4]}", (8,), width=21, color=False,
        ...                        console=Console(width=40))
        {devices=[4]<=[4]} on global shape (8,)
        ┌────┬────┬────┬────┐
        │ 0  │ 1  │ 2  │ 3  │
        └────┴────┴────┴────┘
    """
    console = console or Console()
    text = render_sharding(sharding, shape, mesh, dims=dims,
                           width=width or console.width, color=color)
    console.print(text, no_wrap=True, overflow="ignore", crop=False)
    return text


def render_sharding(sharding: Any, shape: Sequence[int], mesh: Mesh | None = None, *,
                    dims: Sequence[int] | None = None, width: int = 80,
                    color: bool = True) -> Text:
    """The drawing :func:`visualize_sharding` prints, as a ``rich.text.Text``."""
    grid = build_grid(sharding, shape, mesh, dims)
    labels = [[_label(c, grid.granule_of) for c in row] for row in grid.cells]
    ncols = len(grid.col_ranges)
    min_w = [max(_min_width(labels[r][j]) for r in range(len(labels))) for j in range(ncols)]
    nat_w = [max(len(labels[r][j]) + 2 for r in range(len(labels))) for j in range(ncols)]
    ext_c = [hi - lo for lo, hi in grid.col_ranges]
    inner = max(width - ncols - 1, sum(min_w))
    preferred = max(-(-n * sum(ext_c) // max(e, 1)) for n, e in zip(nat_w, ext_c))
    widths, w_ok = _allocate(ext_c, min_w, min(max(preferred, 40), inner), inner)
    wrapped = [[_wrap(labels[r][j], widths[j] - 2) for j in range(ncols)] for r in range(len(labels))]
    need_h = [max(len(lines) for lines in row) for row in wrapped]
    if len(grid.shown) == 2:
        ext_r = [hi - lo for lo, hi in grid.row_ranges]
        target = round(sum(widths) * sum(ext_r) / max(sum(ext_c), 1) / 3)
        heights, h_ok = _allocate(ext_r, need_h, min(max(target, len(ext_r)), MAX_HEIGHT),
                                  max(MAX_HEIGHT, sum(need_h)))
    else:
        heights, h_ok = need_h, True
    notes = list(grid.notes)
    if not (w_ok and h_ok):
        notes.append("not to scale: some cells were enlarged to fit their device ids")
    colours = _colours(grid) if color else {}
    out = Text(grid.title + "\n")
    _draw(out, grid, wrapped, widths, heights, colours)
    for note in notes:
        out.append("\n".join(textwrap.wrap("note: " + note, max(width, 20),
                                           subsequent_indent="  ")) + "\n")
    out.rstrip()
    return out


def _label(cell: Cell, granule_of: dict[int, int] | None) -> str:
    def name(d: int) -> str:
        if d < 0:
            return "all devices"
        return f"{d}{_letter(granule_of[d])}" if granule_of and d in granule_of else str(d)
    return " | ".join(",".join(name(d) for d in part) for part in cell.parts)


def _tokens(label: str) -> list[str]:
    return re.findall(r"\||[^,|]+?,|[^,|]+", label.replace(" | ", "|"))


def _min_width(label: str) -> int:
    return max((len(t.strip()) for t in _tokens(label)), default=0) + 2


def _wrap(label: str, width: int) -> list[str]:
    """Greedy line fill; breaks after commas and around ``|``."""
    lines: list[str] = []
    cur = ""
    for tok in _tokens(label):
        piece = f" {tok} " if tok == "|" else tok
        if cur and len((cur + piece).rstrip()) > width:
            lines.append(cur.rstrip())
            cur = piece.lstrip()
        else:
            cur += piece
    if cur.strip():
        lines.append(cur.rstrip())
    return lines or [""]


def _allocate(ext: list[int], need: list[int], target: int, cap: int) -> tuple[list[int], bool]:
    """Split ``total`` characters proportionally to ``ext`` with at least ``need`` each.

    Returns the sizes and whether they are proportional (each within 1 of exact).
    """
    total = max(sum(ext), 1)
    bounds = [0]
    for e in ext:
        bounds.append(bounds[-1] + e)

    def split(t: int) -> list[int]:
        xs = [int(b * t / total + 0.5) for b in bounds]
        return [b - a for a, b in zip(xs, xs[1:])]

    t = max(target, max((-(-n * total // max(e, 1)) for n, e in zip(need, ext)), default=0))
    while t <= cap:
        sizes = split(t)
        if all(s >= n for s, n in zip(sizes, need)):
            return sizes, True
        t += 1
    return [max(s, n) for s, n in zip(split(min(target, cap)), need)], False


def _colours(grid: Grid) -> dict[tuple[int, ...], Style]:
    out: dict[tuple[int, ...], Style] = {}
    for row in grid.cells:
        for cell in row:
            if cell.devices not in out:
                bg = PALETTE[len(out) % len(PALETTE)]
                r, g, b = (int(bg[i:i + 2], 16) for i in (1, 3, 5))
                fg = "black" if 0.299 * r + 0.587 * g + 0.114 * b > 140 else "white"
                out[cell.devices] = Style(color=fg, bgcolor=bg)
    return out


def _border(widths: list[int], left: str, mid: str, right: str) -> str:
    return left + mid.join("─" * w for w in widths) + right + "\n"


def _draw(out: Text, grid: Grid, wrapped: list[list[list[str]]], widths: list[int],
          heights: list[int], colours: dict[tuple[int, ...], Style]) -> None:
    out.append(_border(widths, "┌", "┬", "┐"))
    for r, row in enumerate(grid.cells):
        top = [(heights[r] - len(lines)) // 2 for lines in wrapped[r]]
        for k in range(heights[r]):
            out.append("│")
            for j, cell in enumerate(row):
                lines = wrapped[r][j]
                text = lines[k - top[j]] if 0 <= k - top[j] < len(lines) else ""
                out.append(text.center(widths[j]), style=colours.get(cell.devices, ""))
                out.append("│")
            out.append("\n")
        last = r == len(grid.cells) - 1
        out.append(_border(widths, *("└", "┴", "┘") if last else ("├", "┼", "┤")))
