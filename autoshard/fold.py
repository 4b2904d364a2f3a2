"""Fold tie groups into one decision node each, keeping the memory constraint exact.

Every tie group (nodes forced to the same strategy index) becomes one node whose cost
is the sum of its members' costs plus the diagonal of the edges inside the group;
edges between groups are summed into one matrix per group pair. Memory: members of a
group that share a liveness interval are summed into one memory carrier; the first
carrier is the group node itself, further ones are zero-cost nodes joined to it by an
edge that is free on the diagonal and infinite off it (so they pick the same index).
Without a memory limit no carriers are made.

Example:
    >>> import numpy as np
    >>> from autoshard.solver.problem import Problem
    >>> p = Problem("p", [np.array([1.0, 2.0]), np.array([3.0, 0.0])], [np.zeros(2)] * 2,
    ...             [(0, 1), (1, 2)], [(0, 1)], [np.array([[0.0, 9.0], [9.0, 0.5]])], None)
    >>> f = fold_ties(p, [[0, 1]])
    >>> f.problem.node_costs[0].tolist(), f.expand([1])
    ([4.0, 2.5], [1, 1])
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from autoshard.solver.problem import Problem


@dataclass
class Folded:
    """The folded problem, and for each of its nodes the original members it stands for."""

    problem: Problem
    group_of: list[int]          # original node -> folded decision node
    members: list[list[int]]     # folded node -> original nodes (carriers: the members whose memory they hold)
    num_groups: int

    def expand(self, strategies: list[int] | tuple[int, ...]) -> list[int]:
        """Strategy per original node from the folded solution."""
        return [int(strategies[g]) for g in self.group_of]

    def fold(self, strategies: list[int] | tuple[int, ...]) -> list[int]:
        """Folded strategy vector (carriers included) from a per-original-node one that respects the ties."""
        out = [0] * self.problem.num_nodes
        for g, mem in enumerate(self.members):
            out[g] = int(strategies[mem[0]])
        return out


def fold_ties(problem: Problem, ties: list[list[int]]) -> Folded:
    """Fold ``problem`` along ``ties`` (a partition of its nodes; singletons may be omitted)."""
    n = problem.num_nodes
    group_of = [-1] * n
    groups: list[list[int]] = []
    for grp in ties:
        for v in grp:
            group_of[v] = len(groups)
        groups.append(list(grp))
    for v in range(n):
        if group_of[v] < 0:
            group_of[v] = len(groups)
            groups.append([v])
    for grp in groups:
        ks = {problem.num_strategies(v) for v in grp}
        if len(ks) != 1:
            raise ValueError(f"tie group {grp[:8]} mixes strategy counts {sorted(ks)}; ties need equal counts")
    costs = [np.sum([np.asarray(problem.node_costs[v], float) for v in grp], axis=0) for grp in groups]
    pair: dict[tuple[int, int], np.ndarray] = {}
    for (u, v), mat in zip(problem.edges, problem.edge_costs):
        gu, gv = group_of[u], group_of[v]
        mat = np.asarray(mat, float)
        if gu == gv:
            costs[gu] = costs[gu] + np.diag(mat)
            continue
        key, m = ((gu, gv), mat) if gu < gv else ((gv, gu), mat.T)
        pair[key] = pair[key] + m if key in pair else m
    names = [_group_name(problem, grp) for grp in groups]
    mems = [np.zeros(len(c)) for c in costs]
    intervals = [(0, 0)] * len(groups)
    members = [list(g) for g in groups]
    if problem.memory_limit is not None:
        for g, grp in enumerate(groups):
            by_iv: dict[tuple[int, int], list[int]] = defaultdict(list)
            for v in grp:
                if np.any(np.asarray(problem.node_memory[v]) != 0):
                    by_iv[tuple(problem.intervals[v])].append(v)
            for j, (iv, vs) in enumerate(by_iv.items()):
                mem = np.sum([np.asarray(problem.node_memory[v], float) for v in vs], axis=0)
                if j == 0:
                    mems[g], intervals[g] = mem, iv
                    continue
                carrier = len(costs)
                costs.append(np.zeros(len(mem)))
                mems.append(mem)
                intervals.append(iv)
                names.append(_group_name(problem, vs))
                members.append(vs)
                k = len(mem)
                pair[(g, carrier)] = np.where(np.eye(k, dtype=bool), 0.0, np.inf)
    folded = Problem(f"{problem.name}/folded", costs, mems, intervals, list(pair), list(pair.values()),
                     problem.memory_limit, names)
    return Folded(folded, group_of, members, len(groups))


def _group_name(problem: Problem, grp: list[int]) -> str:
    name = problem.node_names[grp[0]] if problem.node_names else str(grp[0])
    return name if len(grp) == 1 else f"{name} (+{len(grp) - 1} tied)"
