"""The solver's input: a strategy-selection problem in the shape of the IOPDDL contest.

Every decision node picks one strategy; picking costs ``node_costs[v][p]`` and holds
``node_memory[v][p]`` bytes while ``v`` is live (``intervals[v] = [start, end)``); each
edge (u, v) adds ``edge_costs[k][p, q]``. At every time step the memory of the live
nodes must stay within ``memory_limit`` (``None``: unlimited). ``inf`` costs forbid.
The graph builder (:mod:`autoshard.graph` + strategies) and the IOPDDL reader
(:mod:`autoshard.solver.iopddl`) both produce this; :func:`autoshard.solver.solve_problem`
consumes it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Problem:
    """A strategy-selection problem (see module docstring).

    Example:
        >>> p = Problem("tiny", [np.array([1.0, 2.0])], [np.array([0.0, 0.0])],
        ...             [(0, 1)], [], [], None)
        >>> p.num_nodes
        1
    """

    name: str
    node_costs: list[np.ndarray]
    node_memory: list[np.ndarray]
    intervals: list[tuple[int, int]]
    edges: list[tuple[int, int]]
    edge_costs: list[np.ndarray]  # edge k: array of shape (k_u, k_v)
    memory_limit: float | None
    node_names: list[str] = field(default_factory=list)

    @property
    def num_nodes(self) -> int:
        return len(self.node_costs)

    def num_strategies(self, v: int) -> int:
        return len(self.node_costs[v])
