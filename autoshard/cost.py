"""Cost model from a :class:`mesh.Topology`: roofline compute, alpha-beta resharding, memory.

* compute: ``topology.compute_time(flops / split, bytes of the local shards)``;
* resharding one tensor between two specs, mesh axis by mesh axis: equal = free;
  ``R -> S`` and anything ``-> P`` are local (slice / keep one copy) = free;
  ``S -> R`` all-gather; ``S(d) -> S(e)`` all-to-all; ``P -> R`` all-reduce;
  ``P -> S`` reduce-scatter. Bytes are the tensor's size divided by the splits on
  the other mesh axes;
* a tensor dim split over several mesh axes is split in mesh order (the first axis
  major), as the partition spec realizes it. A device keeps its shard of such a dim
  only while the axes that stay are a *prefix* of both orders: from ``S(0)S(0)``
  (dim 0 over (data, model)) to ``RS(0)`` (over model) the model axis, though placed
  alike, must be gathered too (XLA gathers the whole dim and slices it), and from
  ``RS(0)`` to ``S(0)S(0)`` the model shard is not a slice of what the device holds
  (gathered, then sliced; XLA moves it by a collective-permute, charged the same);
* elementwise followers are fused by XLA into their neighbours: they are charged
  their flops only, not an unfused pass over memory (which would over-reward sharding
  the optimizer update and activations on bandwidth-poor presets);
* memory: bytes of a node's local output shards (``P`` holds the full size);
* gradients: XLA's collective combiners merge the step's gradient reductions into a
  few large collectives, so resharding a gradient is charged its bandwidth term only
  (:func:`combined_collectives`); paying one latency per parameter would overprice
  data parallelism, most on latency-bound links.

Example:
    >>> from mesh import Mesh, topology_for
    >>> from autoshard.graph import TensorMeta
    >>> topo = topology_for(Mesh(range(8), (8,), ("data",)), "tpu-v5e")
    >>> t = TensorMeta((1024, 1024), "float32")
    >>> reshard_cost(("P",), ("R",), t, topo) > reshard_cost(("P",), (("S", 0),), t, topo) > 0
    True
"""
from __future__ import annotations

from functools import lru_cache

from dataclasses import replace

from mesh import Link, Topology

from autoshard.graph import TensorMeta
from autoshard.spec import Spec, is_shard, shard_count
from autoshard.strategies.base import Strategy


def combined_collectives(topo: Topology) -> Topology:
    """``topo`` with zero latency: the link model of collectives XLA combines into one."""
    return replace(topo, links=tuple(Link(link.kind, 0.0, link.beta) for link in topo.links))


def reshard_cost(src: Spec, dst: Spec, meta: TensorMeta, topo: Topology) -> float:
    """Seconds to turn a tensor laid out as ``src`` into ``dst`` (see module docstring)."""
    return _reshard(src, dst, meta.nbytes, topo)


@lru_cache(maxsize=1 << 16)
def _reshard(src: Spec, dst: Spec, nbytes: int, topo: Topology) -> float:
    if src == dst:
        return 0.0
    sizes = topo.axis_sizes
    src = _unkept(src, dst)
    groups: dict[tuple, list[int]] = {}
    for a, (s, d) in enumerate(zip(src, dst)):
        kind = _transition(s, d)
        if kind is None or sizes[a] == 1:
            continue
        # one collective over every axis doing the same thing on the same link (XLA issues one)
        key = (kind, topo.links[a]) if kind != "all_to_all" else (kind, a)
        groups.setdefault(key, []).append(a)
    total = 0.0
    for (kind, _), axes in groups.items():
        other = 1
        for b, (s2, d2) in enumerate(zip(src, dst)):
            if b not in axes and (is_shard(s2) or is_shard(d2)):
                other *= sizes[b]
        total += topo.collective(kind, nbytes / other, tuple(axes))
    return total


def _unkept(src: Spec, dst: Spec) -> Spec:
    """``src`` with every shard that ``dst`` does not keep in place marked ``("G", dim)``.

    Per tensor dim, the axes splitting it in mesh order; only the common prefix of the
    source's and the destination's lists stays local, the source's later axes are
    gathered (see module docstring).
    """
    dims = {p[1] for p in src if is_shard(p)}
    out = list(src)
    for k in dims:
        s_axes = [a for a, p in enumerate(src) if p == ("S", k)]
        d_axes = [a for a, p in enumerate(dst) if p == ("S", k)]
        keep = 0
        while keep < min(len(s_axes), len(d_axes)) and s_axes[keep] == d_axes[keep]:
            keep += 1
        for a in s_axes[keep:]:
            if dst[a] == src[a]:
                out[a] = ("G", k)
    return tuple(out)


def _transition(s: object, d: object) -> str | None:
    """The collective turning placement ``s`` into ``d`` along one mesh axis (None: local)."""
    if s == d or (s == "R" and (d == "P" or is_shard(d))):
        return None
    if isinstance(s, tuple) and s[0] == "G":  # a shard kept in place that must be re-laid: gather, re-slice
        return "all_gather"
    if s == "P":
        return "all_reduce" if d == "R" else "reduce_scatter"
    if d in ("R", "P"):  # S -> P: gathered, see module docstring
        return "all_gather"
    return "all_to_all"


def compute_cost(strategy: Strategy, flops: float, in_metas: tuple[TensorMeta, ...],
                 out_metas: tuple[TensorMeta, ...], topo: Topology, fused: bool = False) -> float:
    """Roofline seconds of one device's share of the op under ``strategy``.

    ``fused``: the op is fused into its neighbours (XLA fuses elementwise chains), so it
    moves no memory of its own and costs only its flops.
    """
    if flops == 0.0:
        return 0.0
    if fused:
        return topo.compute_time(flops / strategy.split, 0.0)
    sizes = topo.axis_sizes
    nbytes = sum(m.nbytes / shard_count(s, sizes) for m, s in zip(in_metas, strategy.in_specs))
    nbytes += sum(m.nbytes / shard_count(s, sizes) for m, s in zip(out_metas, strategy.out_specs))
    return topo.compute_time(flops / strategy.split, nbytes)


def memory_bytes(specs: tuple[Spec, ...], metas: tuple[TensorMeta, ...], axis_sizes: tuple[int, ...]) -> float:
    """Bytes one device holds for these tensors (``P`` and ``R`` axes keep full copies)."""
    return float(sum(m.nbytes / shard_count(s, axis_sizes) for m, s in zip(metas, specs)))
