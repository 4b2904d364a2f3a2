"""Tie groups: union-find over nodes, and layer tying by structural signatures.

Identical repeated blocks (the layers of a transformer) produce nodes whose op,
shapes, parameter names with layer numbers masked (``h.#.attn.q_proj.weight``) and
neighbourhood up to a few hops agree. Groups of tied nodes (a leader with its
followers) whose member signatures agree as multisets are tied together: one set of
decision variables for all layers, as in Alpa's layer-wise tying.

Example:
    >>> uf = UnionFind(4); uf.union(0, 2); uf.union(1, 3)
    >>> uf.groups()
    [[0, 2], [1, 3]]
"""
from __future__ import annotations

import hashlib
import re
from collections import defaultdict

from autoshard.graph import Graph

_DIGITS = re.compile(r"\d+")


class UnionFind:
    """Disjoint sets over ``0..n-1`` with path halving."""

    def __init__(self, n: int) -> None:
        self.parent = list(range(n))

    def find(self, x: int) -> int:
        p = self.parent
        while p[x] != x:
            p[x] = p[p[x]]
            x = p[x]
        return x

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)

    def groups(self) -> list[list[int]]:
        out: dict[int, list[int]] = defaultdict(list)
        for v in range(len(self.parent)):
            out[self.find(v)].append(v)
        return sorted(out.values())


def _h(obj: object) -> str:
    return hashlib.blake2b(repr(obj).encode(), digest_size=8).hexdigest()


def signatures(graph: Graph, depth: int = 3) -> list[str]:
    """Per-node structural hash over ``depth`` hops of producers and users."""
    sig = [_h((n.op, [(o.shape, o.dtype) for o in n.outputs], n.role, n.args,
               _DIGITS.sub("#", n.name) if n.op == "placeholder" else ""))
           for n in graph.nodes]
    users = graph.users()
    for _ in range(depth):
        sig = [_h((sig[n.id], [(sig[u], i) for u, i in n.inputs], sorted(sig[w] for w in users[n.id])))
               for n in graph.nodes]
    return sig


def layer_ties(graph: Graph, uf: UnionFind, num_strategies: list[int], depth: int = 3) -> int:
    """Union groups whose member signatures match; returns how many groups were merged away."""
    sig = signatures(graph, depth)
    buckets: dict[tuple[str, int], list[int]] = defaultdict(list)
    for grp in uf.groups():
        if grp[0] >= len(sig):
            continue  # nodes past the graph (reshard fan-outs) are tied by the caller
        key = (_h(sorted(sig[v] for v in grp)), num_strategies[grp[0]])
        buckets[key].append(grp[0])
    merged = 0
    for roots in buckets.values():
        for r in roots[1:]:
            uf.union(roots[0], r)
            merged += 1
    return merged
