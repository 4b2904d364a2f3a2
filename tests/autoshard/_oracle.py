"""Random problems shaped like XLA's (follower nodes tied by permutation edges) and an exact
oracle that shares no code with the compact pipeline (contraction, dominance, search).

The oracle is the marginal-form MIP of :mod:`autoshard.solver._lp` on the plain presolve
(:func:`autoshard.solver._presolve.reduce`), solved by SCIP to optimality; for tiny problems
:func:`autoshard.solver.brute.brute_force` is used instead.
"""
from __future__ import annotations

import math

import numpy as np

from autoshard.solver._lp import build_model, solve_model
from autoshard.solver._memory import memory_rows
from autoshard.solver._presolve import flatten, reduce
from autoshard.solver.brute import brute_force
from autoshard.solver.problem import Problem


def tied_problem(seed: int, n: int = 12, memory: str = "tight") -> Problem:
    """``n`` nodes: leaders with 2-5 strategies, followers tied to an earlier node by a
    permutation edge (finite on one permuted diagonal, inf elsewhere), random edges with
    resharding-like costs (0 on a random matching of strategies), memory on intervals."""
    rng = np.random.default_rng(seed)
    ks, costs, mem, edges, mats = [], [], [], [], []
    follows: dict[int, tuple[int, np.ndarray]] = {}
    for v in range(n):
        if v and rng.random() < 0.45:  # follower of an earlier node
            u = int(rng.integers(v))
            k = ks[u]
            perm = rng.permutation(k)
            follows[v] = (u, perm)
            m = np.full((k, k), math.inf)
            m[np.arange(k), perm] = rng.integers(0, 5, k)
            edges.append((u, v))
            mats.append(m)
        else:
            k = int(rng.integers(2, 6))
        ks.append(k)
        c = rng.integers(0, 40, k).astype(float)
        c[rng.integers(k)] = 0.0
        costs.append(c)
        mem.append(rng.integers(1, 10, k).astype(float))
    for _ in range(int(n * 0.8)):
        u, v = (int(x) for x in rng.choice(n, 2, replace=False))
        m = rng.integers(5, 60, (ks[u], ks[v])).astype(float)
        m[rng.permutation(ks[u])[:min(ks[u], ks[v])], rng.permutation(ks[v])[:min(ks[u], ks[v])]] = 0
        edges.append((u, v))
        mats.append(m)
    starts = rng.integers(0, 2 * n, n)
    intervals = [(int(s), int(s + rng.integers(1, n))) for s in starts]
    p = Problem(f"tied{seed}", costs, mem, intervals, edges, mats, None)
    if memory == "tight":
        # the lowest peak among random plans that respect the ties: feasible, and tight
        peaks = []
        for _ in range(40):
            plan = [int(rng.integers(k)) for k in ks]
            for v, (u, perm) in follows.items():  # in order: leaders come first
                plan[v] = int(perm[plan[u]])
            peaks.append(_peak(p, plan))
        p.memory_limit = float(min(peaks))
    return p


def _peak(p: Problem, plan: list[int]) -> float:
    from autoshard.solver.evaluate import memory_profile
    prof = memory_profile(p, plan)
    return float(prof.max()) if prof.size else 0.0


def exact_optimum(p: Problem, time_limit: float = 60.0) -> float:
    """The optimal cost (inf if no feasible plan), by brute force or the plain MIP."""
    if math.prod(len(c) for c in p.node_costs) <= 200_000:
        return brute_force(p, max_plans=200_000)[0]
    f = flatten(p)
    red = reduce(f, dedup=False)
    if red.empty_nodes.size:
        return math.inf
    mem = None if p.memory_limit is None else memory_rows(f, red.allowed, p.memory_limit)
    if mem is not None and mem.peak_lower_bound > p.memory_limit:
        return math.inf
    model = build_model(red, mem, limit=p.memory_limit)
    if model.num_s == 0:
        return red.const
    res = solve_model(model, "scip", time_limit, integer=True, params="limits/gap = 0\n")
    if res.status == "INFEASIBLE":
        return math.inf
    assert res.status == "OPTIMAL", f"oracle did not finish: {res.status}"
    return res.objective
