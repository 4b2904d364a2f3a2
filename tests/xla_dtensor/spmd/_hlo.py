"""Reading the collectives out of compiled (partitioned) HLO text, for the layout tests.

Example:
    >>> text = '  %ag = f32[4,16,8]{2,1,0} all-gather(%x), replica_groups={{0,1}}, dimensions={1}'
    >>> [(c.kind, c.shape, c.dims) for c in collectives(text)]
    [('all-gather', (4, 16, 8), (1,))]
"""
from __future__ import annotations

import re
from dataclasses import dataclass

_LINE = re.compile(r"^\s*(?:ROOT )?(%[\w.-]+) = (\S+) ([\w-]+)\((.*)$")
_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


@dataclass(frozen=True)
class Collective:
    """One collective: its kind, result shape, gathered/scattered dims and the shapes
    its users produce (how the result is consumed: say only this device's slice)."""

    kind: str
    shape: tuple[int, ...]
    dims: tuple[int, ...]
    user_shapes: tuple[tuple[int, ...], ...]


def _shape(text: str) -> tuple[int, ...]:
    m = re.match(r"\(?[a-z]+\d*\[([\d,]*)\]", text)
    return tuple(int(x) for x in m.group(1).split(",") if x) if m else ()


def collectives(hlo: str) -> list[Collective]:
    """Every collective of the entry and fused computations, in text order."""
    parsed = [(m.group(1), m.group(2), m.group(3), line) for line in hlo.splitlines()
              if (m := _LINE.match(line))]
    out = []
    for name, shape, op, line in parsed:
        kind = op.removesuffix("-start")
        if kind not in _KINDS:
            continue
        dims = re.search(r"dimensions=\{([\d,]*)\}", line)
        use = re.compile(re.escape(name) + r"[,)\s]")
        users = tuple(_shape(s) for n, s, _, ln in parsed if n != name and use.search(ln.split("(", 1)[1]))
        out.append(Collective(kind, _shape(shape), tuple(int(d) for d in dims.group(1).split(",") if d)
                              if dims else (), users))
    return out
