"""Topology: per mesh axis an alpha-beta link model, plus the device's roofline numbers.

Collective costs (n = devices along the axes, B = bytes of the full tensor):

* all-gather, reduce-scatter: ``alpha + beta * (n-1)/n * B``
* all-reduce: ``alpha + 2 * beta * (n-1)/n * B``
* all-to-all: ``alpha + beta * (n-1)/n**2 * B * n/2``
* over several axes at once: the largest alpha and beta, n = product of sizes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Literal, Sequence

from mesh.errors import AxisError, TopologyError

Collective = Literal["all_gather", "reduce_scatter", "all_reduce", "all_to_all"]
COLLECTIVES: tuple[Collective, ...] = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


@dataclass(frozen=True, slots=True)
class Link:
    """One kind of link: latency ``alpha`` (s) and inverse bandwidth ``beta`` (s/byte).

    Example:
        >>> Link.from_bandwidth("ici", latency_s=1e-6, gbytes_per_s=100).beta
        1e-11
    """

    kind: str
    alpha: float
    beta: float

    @classmethod
    def from_bandwidth(cls, kind: str, latency_s: float, gbytes_per_s: float) -> Link:
        return cls(kind, latency_s, 1.0 / (gbytes_per_s * 1e9))


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """Roofline numbers of one device: peak flop/s, memory bytes/s, memory capacity bytes."""

    name: str
    peak_flops: float
    memory_bandwidth: float
    memory_bytes: float


@dataclass(frozen=True, slots=True)
class Topology:
    """Link model for every axis of a mesh, and the device the mesh is made of.

    Example:
        >>> t = Topology(("data", "model"), (2, 4), (ICI, ICI), V5E)  # doctest: +SKIP
        >>> t.all_reduce(1 << 20, "model")  # seconds  # doctest: +SKIP
    """

    axis_names: tuple[str, ...]
    axis_sizes: tuple[int, ...]
    links: tuple[Link, ...]
    device: DeviceSpec
    name: str = "custom"

    def __post_init__(self) -> None:
        n = len(self.axis_sizes)
        if len(self.axis_names) != n or len(self.links) != n:
            raise TopologyError(f"topology needs one name and one link per axis: names "
                                f"{self.axis_names}, sizes {self.axis_sizes}, {len(self.links)} links")

    def axis_index(self, axis: str | int) -> int:
        if isinstance(axis, int) and not isinstance(axis, bool) and -len(self.axis_sizes) <= axis < len(self.axis_sizes):
            return axis % len(self.axis_sizes)
        if isinstance(axis, str) and axis in self.axis_names:
            return self.axis_names.index(axis)
        raise AxisError(f"unknown mesh axis {axis!r}; topology axes are {list(self.axis_names)}")

    def _group(self, axes: str | int | Iterable[str | int]) -> tuple[float, float, int]:
        idx = [self.axis_index(a) for a in ((axes,) if isinstance(axes, (str, int)) else axes)]
        if len(set(idx)) != len(idx):
            raise AxisError(f"axes {axes!r} name one mesh axis twice")
        idx = [i for i in idx if self.axis_sizes[i] > 1]
        if not idx:
            return 0.0, 0.0, 1
        n = math.prod(self.axis_sizes[i] for i in idx)
        return max(self.links[i].alpha for i in idx), max(self.links[i].beta for i in idx), n

    def all_gather(self, nbytes: float, axes: str | int | Sequence[str | int]) -> float:
        """Seconds to all-gather a tensor whose gathered size is ``nbytes``."""
        alpha, beta, n = self._group(axes)
        return 0.0 if n == 1 else alpha + beta * (n - 1) / n * nbytes

    def reduce_scatter(self, nbytes: float, axes: str | int | Sequence[str | int]) -> float:
        """Seconds to reduce-scatter a tensor of ``nbytes`` (the unreduced size per device)."""
        return self.all_gather(nbytes, axes)

    def all_reduce(self, nbytes: float, axes: str | int | Sequence[str | int]) -> float:
        """Seconds to all-reduce a tensor of ``nbytes``."""
        alpha, beta, n = self._group(axes)
        return 0.0 if n == 1 else alpha + 2 * beta * (n - 1) / n * nbytes

    def all_to_all(self, nbytes: float, axes: str | int | Sequence[str | int]) -> float:
        """Seconds for an all-to-all of a tensor of ``nbytes`` (full size)."""
        alpha, beta, n = self._group(axes)
        return 0.0 if n == 1 else alpha + beta * (n - 1) / n**2 * nbytes * n / 2

    def collective(self, kind: Collective, nbytes: float, axes: str | int | Sequence[str | int]) -> float:
        """Dispatch by name: one of :data:`COLLECTIVES`."""
        if kind not in COLLECTIVES:
            raise TopologyError(f"unknown collective {kind!r}; allowed: {list(COLLECTIVES)}")
        return getattr(self, kind)(nbytes, axes)

    def compute_time(self, flops: float, bytes_accessed: float) -> float:
        """Roofline time of one shard: ``max(flops / peak, bytes / memory bandwidth)``."""
        return max(flops / self.device.peak_flops, bytes_accessed / self.device.memory_bandwidth)

    @property
    def num_devices(self) -> int:
        return math.prod(self.axis_sizes)
