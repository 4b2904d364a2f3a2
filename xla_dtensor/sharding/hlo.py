"""``HloSharding``: XLA's sharding annotation as a value, parsed from and printed to text.

Forms understood (the ones XLA prints for array shardings)::

    {replicated}
    {maximal device=3}
    {devices=[2,4]0,1,2,3,4,5,6,7}                               V1: explicit device list
    {devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}        V2: iota tile assignment

``devices=[t0,...,tk]`` is the tile-assignment shape: tensor dim ``i`` is cut into
``ti`` tiles; with ``last_tile_dim_replicate`` (or ``last_tile_dims={replicated}``)
the last entry is the size of each group of replicas. The device list fills that
array row-major. The V2 list is ``arange(N).reshape(r).transpose(T).reshape(-1)``.

Parsing is bounded: a tile assignment of more than :data:`MAX_DEVICES` devices, and a
number of more than :data:`_MAX_DIGITS` digits, are an :class:`HloParseError` before
anything is allocated (``{devices=[1]<=[400000000]}`` would otherwise build a
400-million-entry list).

NOTE: an HLO sharding's device numbers are positions in the program's device
assignment. This library's device assignment is all devices in id order (as in
torch_xla), so the numbers here are device ids. JAX numbers positions in the mesh's
device order instead; the two agree on meshes whose ids are ``0..n-1`` in order.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from math import prod
from typing import Sequence

import numpy as np

from xla_dtensor.sharding.errors import HloParseError, SpecTypeError

MAX_DEVICES = 1 << 17
"""The most devices a parsed tile assignment may hold (131,072: above any machine built)."""
_MAX_DIGITS = 12
_MAX_RANK = 64  # numpy's limit on array dims

_FORMS = ("{replicated}", "{maximal device=N}", "{devices=[t0,...]d0,d1,...}",
          "{devices=[t0,...]<=[r0,...]T(p0,...)}", "optional ' last_tile_dim_replicate'")


@dataclass(frozen=True, slots=True)
class HloSharding:
    """An XLA array sharding: replicated, maximal (one device), or tiled.

    Args:
        tile_shape: tiles per tensor dim; ``()`` for replicated and maximal shardings.
        devices: the tile assignment flattened row-major over ``tile_shape + (replicas,)``.
        replicas: size of each replica group (the ``last_tile_dim_replicate`` dim), 1 if none.
        maximal_device: the device holding the whole tensor for a maximal sharding.

    Example:
        >>> h = HloSharding.parse("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}")
        >>> h.tile_shape, h.replicas, h.devices
        ((4, 1), 2, (0, 4, 1, 5, 2, 6, 3, 7))
        >>> str(h)
        '{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}'
        >>> h.to_string(iota=False)
        '{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}'
    """

    tile_shape: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    replicas: int = 1
    maximal_device: int | None = None

    def __post_init__(self) -> None:
        tiles = tuple(int(t) for t in self.tile_shape)
        devs = tuple(int(d) for d in self.devices)
        object.__setattr__(self, "tile_shape", tiles)
        object.__setattr__(self, "devices", devs)
        if self.maximal_device is not None:
            if tiles or devs or self.replicas != 1 or self.maximal_device < 0:
                raise SpecTypeError(f"a maximal sharding has only a device id >= 0, got "
                                    f"tile_shape={tiles}, devices={devs}, device={self.maximal_device}")
            return
        if not tiles:
            if devs or self.replicas != 1:
                raise SpecTypeError(f"a replicated HloSharding has no devices/replicas, got {devs}")
            return
        if any(t < 1 for t in tiles) or self.replicas < 1:
            raise SpecTypeError(f"tile counts must be >= 1, got tile_shape={tiles}, "
                                f"replicas={self.replicas}")
        if len(devs) != prod(tiles) * self.replicas:
            raise SpecTypeError(f"tile assignment {list(tiles) + [self.replicas]} holds "
                                f"{prod(tiles) * self.replicas} devices but {len(devs)} were given")
        if len(set(devs)) != len(devs) or min(devs) < 0:
            raise SpecTypeError(f"tile assignment devices must be distinct ids >= 0, got {list(devs)}")

    # -- kinds ------------------------------------------------------------------------
    @property
    def is_maximal(self) -> bool:
        return self.maximal_device is not None

    @property
    def is_tiled(self) -> bool:
        return bool(self.tile_shape)

    @property
    def is_replicated(self) -> bool:
        """True for ``{replicated}`` and for tilings that cut no dim."""
        return not self.is_maximal and all(t == 1 for t in self.tile_shape)

    @property
    def ndim(self) -> int | None:
        """Rank of the tensor (``None`` for replicated/maximal, which fit any rank)."""
        return len(self.tile_shape) if self.tile_shape else None

    def device_array(self) -> np.ndarray:
        """The tile assignment as an int array of shape ``tile_shape + (replicas,)``."""
        if not self.is_tiled:
            raise SpecTypeError(f"{self} has no tile assignment")
        return np.asarray(self.devices, dtype=np.int64).reshape(self.tile_shape + (self.replicas,))

    # -- text -------------------------------------------------------------------------
    @staticmethod
    def parse(text: str) -> HloSharding:
        """Parse an HLO sharding string (see the module docstring for the forms)."""
        return _parse(text)

    def to_string(self, iota: bool | None = None) -> str:
        """The HLO text. ``iota=None`` uses the V2 iota form when the devices allow it."""
        if self.is_maximal:
            return f"{{maximal device={self.maximal_device}}}"
        if not self.is_tiled:
            return "{replicated}"
        dims = list(self.tile_shape) + ([self.replicas] if self.replicas > 1 else [])
        head = "{devices=[" + ",".join(map(str, dims)) + "]"
        tail = " last_tile_dim_replicate}" if self.replicas > 1 else "}"
        form = iota_form(self.devices) if iota is not False else None
        if iota and form is None:
            raise SpecTypeError(f"devices {list(self.devices)} are not an iota tile assignment")
        if form is None:
            return head + ",".join(map(str, self.devices)) + tail
        reshape, perm = form
        body = "<=[" + ",".join(map(str, reshape)) + "]"
        if list(perm) != sorted(perm):
            body += "T(" + ",".join(map(str, perm)) + ")"
        return head + body + tail

    def __str__(self) -> str:
        return self.to_string()


def iota_form(devices: Sequence[int]) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """``(reshape_dims, perm)`` with ``arange(n).reshape(r).transpose(perm).ravel() == devices``.

    Returns the canonical form XLA prints (size-1 dims dropped, dims that stay
    adjacent merged), or ``None`` when ``devices`` is not such a permutation.

    Example:
        >>> iota_form([0, 4, 1, 5, 2, 6, 3, 7])
        ((2, 4), (1, 0))
    """
    p = np.asarray(devices, dtype=np.int64)
    n = len(p)
    if n == 0 or p[0] != 0 or sorted(p.tolist()) != list(range(n)):
        return None
    runs: list[tuple[int, int]] = []  # (size, stride) of output dims, innermost first
    seq = p
    while len(seq) > 1:
        stride = int(seq[1] - seq[0])
        size = 1
        while size < len(seq) and seq[size] == seq[0] + size * stride:
            size += 1
        if stride <= 0 or len(seq) % size:
            return None
        runs.append((size, stride))
        seq = seq[::size]
    by_stride = sorted(runs, key=lambda r: -r[1])
    reshape = tuple(size for size, _ in by_stride) or (1,)
    perm = tuple(by_stride.index(r) for r in reversed(runs)) or (0,)
    rebuilt = np.arange(n).reshape(reshape).transpose(perm).reshape(-1)
    return (reshape, perm) if np.array_equal(rebuilt, p) else None


# -- parser -----------------------------------------------------------------------------
_INTS = r"\s*-?\d+(?:\s*,\s*-?\d+)*\s*"
_TILED = re.compile(
    r"^devices=\[(?P<dims>" + _INTS + r")\]\s*"
    r"(?:<=\[(?P<reshape>" + _INTS + r")\]\s*(?:T\((?P<perm>" + _INTS + r")\))?"
    r"|(?P<list>" + _INTS + r"))"
    r"(?P<flags>(?:\s+[a-z_]+(?:=\{[a-z_,\s]*\})?)*)\s*$")


def _ints(text: str, whole: str) -> list[int]:
    parts = text.split(",")
    if len(parts) > MAX_DEVICES:
        raise _fail(whole, f"a list of {len(parts)} numbers is longer than MAX_DEVICES={MAX_DEVICES}")
    long = next((p.strip() for p in parts if len(p.strip().lstrip("-")) > _MAX_DIGITS), None)
    if long is not None:
        raise _fail(whole, f"the number {long[:20]}{'...' if len(long) > 20 else ''} has more than "
                           f"{_MAX_DIGITS} digits")
    return [int(x) for x in parts]


def _bounded(text: str, what: str, dims: list[int]) -> None:
    """Refuse ``dims`` whose product exceeds :data:`MAX_DEVICES` (checked before any allocation)."""
    if len(dims) > _MAX_RANK:
        raise _fail(text, f"{what} have {len(dims)} entries, more than {_MAX_RANK}")
    n = 1
    for d in dims:
        n *= max(d, 1)
        if n > MAX_DEVICES:
            raise _fail(text, f"{what} {dims} hold more than MAX_DEVICES={MAX_DEVICES} devices")


def _fail(text: str, why: str) -> HloParseError:
    shown = text if len(text) <= 200 else f"{text[:200]}... ({len(text)} characters)"
    return HloParseError(f"malformed HLO sharding {shown!r}: {why}. Allowed forms: {', '.join(_FORMS)}")


def _parse(text: str) -> HloSharding:
    if not isinstance(text, str):
        raise SpecTypeError(f"an HLO sharding string is a str, got {type(text).__name__}: {text!r}")
    body = re.sub(r"\s*metadata=\{[^{}]*\}", "", text.strip())
    body = body[len("sharding="):] if body.startswith("sharding=") else body
    if not (body.startswith("{") and body.endswith("}")):
        raise _fail(text, "it must be wrapped in braces")
    inner = body[1:-1].strip()
    if inner.startswith("{"):
        raise _fail(text, "tuple shardings (one per tuple element) are not array shardings")
    if inner == "replicated":
        return HloSharding()
    m = re.fullmatch(r"maximal\s+device=(\d+)", inner)
    if m and len(m.group(1)) > _MAX_DIGITS:
        raise _fail(text, f"device number {m.group(1)[:20]}... has more than {_MAX_DIGITS} digits")
    if m:
        return HloSharding(maximal_device=int(m.group(1)))
    if inner in ("manual", "unknown") or inner.startswith("unreduced"):
        raise _fail(text, f"{inner!r} shardings describe no device layout")
    m = _TILED.match(inner)
    if not m:
        raise _fail(text, "could not read it")
    dims = _ints(m.group("dims"), text)
    if any(d < 1 for d in dims):
        raise _fail(text, f"tile dims {dims} must all be >= 1")
    _bounded(text, "tile dims", dims)
    if m.group("list") is not None:
        devices = _ints(m.group("list"), text)
    else:
        devices = _iota_devices(text, _ints(m.group("reshape"), text),
                                _ints(m.group("perm"), text) if m.group("perm") else None)
    replicate = _replicate_flag(text, m.group("flags").split())
    if len(devices) != prod(dims):
        raise _fail(text, f"tile dims {dims} need {prod(dims)} devices, got {len(devices)}")
    if len(set(devices)) != len(devices) or min(devices) < 0:
        raise _fail(text, f"devices must be distinct ids >= 0, got {devices}")
    if replicate and len(dims) < 2:
        raise _fail(text, f"last_tile_dim_replicate needs a replica dim after the tensor dims, "
                          f"got tile dims {dims}")
    tiles, replicas = (dims[:-1], dims[-1]) if replicate else (dims, 1)
    return HloSharding(tuple(tiles), tuple(devices), replicas)


def _iota_devices(text: str, reshape: list[int], perm: list[int] | None) -> list[int]:
    if any(r < 1 for r in reshape):
        raise _fail(text, f"iota reshape dims {reshape} must all be >= 1")
    _bounded(text, "iota reshape dims", reshape)
    perm = list(range(len(reshape))) if perm is None else perm
    if sorted(perm) != list(range(len(reshape))):
        raise _fail(text, f"T{tuple(perm)} is not a permutation of {list(range(len(reshape)))}")
    return np.arange(prod(reshape)).reshape(reshape).transpose(perm).reshape(-1).tolist()


def _replicate_flag(text: str, flags: list[str]) -> bool:
    replicate = False
    for flag in flags:
        if flag == "last_tile_dim_replicate" or re.fullmatch(r"last_tile_dims=\{replicated\}", flag):
            replicate = True
        elif flag.startswith("last_tile_dims="):
            raise _fail(text, f"{flag} (manual/unreduced subgroups) is not supported; only "
                              "last_tile_dims={replicated}")
        else:
            raise _fail(text, f"unknown flag {flag!r}")
    return replicate
