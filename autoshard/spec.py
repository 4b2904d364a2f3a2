"""Placements: how one tensor is laid out over an N-D mesh, as plain serializable values.

A :data:`Spec` has one :data:`Placement` per mesh axis, as in DTensor: ``"R"``
(replicated), ``("S", d)`` (tensor dim ``d`` split along the axis) or ``"P"``
(partial sums, reduced later). Several axes may split the same dim; the earlier axis
is the major one (DTensor's and JAX's order).

Example:
    >>> spec = (("S", 0), "R")
    >>> local_shape((8, 6), spec, (2, 4)), spec_str(spec), partition_spec(spec, ("data", "model"), 2)
    ((4, 6), 'S(0)R', ('data', None))
"""
from __future__ import annotations

from typing import Sequence, Tuple, Union

Placement = Union[str, Tuple[str, int]]
Spec = Tuple[Placement, ...]


def replicated(ndim_mesh: int) -> Spec:
    """The all-replicated spec on a mesh with ``ndim_mesh`` axes."""
    return ("R",) * ndim_mesh


def is_shard(p: Placement) -> bool:
    return isinstance(p, tuple) and p[0] == "S"


def dim_factor(spec: Spec, dim: int, axis_sizes: Sequence[int]) -> int:
    """How many pieces tensor dim ``dim`` is split into."""
    f = 1
    for p, n in zip(spec, axis_sizes):
        if is_shard(p) and p[1] == dim:
            f *= n
    return f


def shard_count(spec: Spec, axis_sizes: Sequence[int]) -> int:
    """Into how many distinct pieces the tensor is split (``P`` and ``R`` axes do not split)."""
    f = 1
    for p, n in zip(spec, axis_sizes):
        f *= n if is_shard(p) else 1
    return f


def local_shape(shape: Sequence[int], spec: Spec, axis_sizes: Sequence[int]) -> tuple[int, ...]:
    """Shape of one device's shard (dims must divide; see :func:`divides`)."""
    return tuple(s // dim_factor(spec, d, axis_sizes) for d, s in enumerate(shape))


def divides(shape: Sequence[int], spec: Spec, axis_sizes: Sequence[int]) -> bool:
    """Whether every split dim divides evenly (uneven strategies are skipped, not planned)."""
    return all(s % dim_factor(spec, d, axis_sizes) == 0 for d, s in enumerate(shape))


def spec_str(spec: Spec) -> str:
    """Compact text: one ``R``, ``P`` or ``S(d)`` per mesh axis."""
    return "".join(p if isinstance(p, str) else f"S({p[1]})" for p in spec)


def parse_spec(text: str) -> Spec:
    """Inverse of :func:`spec_str`.

    Example:
        >>> parse_spec("S(1)RP")
        (('S', 1), 'R', 'P')
    """
    out: list[Placement] = []
    i = 0
    while i < len(text):
        if text[i] in "RP":
            out.append(text[i])
            i += 1
        elif text.startswith("S(", i):
            j = text.index(")", i)
            out.append(("S", int(text[i + 2:j])))
            i = j + 1
        else:
            raise ValueError(f"bad placement text {text!r} at {i}; expected R, P or S(d)")
    return tuple(out)


def partition_spec(spec: Spec, axis_names: Sequence[str], ndim: int) -> tuple:
    """JAX ``PartitionSpec`` entries per tensor dim: ``None``, an axis name, or a tuple of names.

    ``P`` axes have no partition-spec form (they are reduced before annotation).
    """
    dims: list[list[str]] = [[] for _ in range(ndim)]
    for p, name in zip(spec, axis_names):
        if is_shard(p):
            dims[p[1]].append(name)
    return tuple(None if not d else d[0] if len(d) == 1 else tuple(d) for d in dims)


def to_json(spec: Spec) -> list:
    return [p if isinstance(p, str) else ["S", p[1]] for p in spec]


def from_json(items: Sequence) -> Spec:
    return tuple(p if isinstance(p, str) else ("S", int(p[1])) for p in items)
