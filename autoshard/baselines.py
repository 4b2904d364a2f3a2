"""Manual baselines scored by the same cost model: DP, FSDP, Megatron TP, 2D, DCN-DP x ICI-TP.

A baseline fixes the placement of every parameter (and its optimizer state) and of
the inputs, per mesh axis:

* ``dp``: parameters replicated, inputs split on the batch dim;
* ``fsdp``: parameters split on their largest dividing dim, inputs on the batch dim;
* ``tp`` (Megatron): column-parallel weights split on the output dim, row-parallel
  ones (``c_proj``, ``o_proj``, ``down_proj``, ``fc2``, ``out_proj``, ``dense_4h_to_h``)
  on the input dim, embeddings on the vocabulary dim, the rest replicated; inputs
  replicated.

Activations are then completed by solving the same ILP as the auto-sharder with the
baseline's placements pinned (warm-started from a greedy completion in execution order
improved by a few sweeps of coordinate descent, which is also the fallback), so each
baseline is the best layout the cost model finds for those parameter placements (what
XLA's propagation is assumed to reach), respecting ties. A greedy completion alone
overprices a baseline: it fixes each activation looking only at its already-decided
producers, e.g. resharding around a reshape that a later consumer would have avoided.

Example:
    >>> baseline_axes("2d", ("data", "model"), ("ici", "ici"))
    ('dp', 'tp')
"""
from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace

import numpy as np

from autoshard.build import Model
from autoshard.solver.evaluate import evaluate
from autoshard.fold import Folded
from autoshard.solver import solve_problem
from autoshard.spec import Spec

COMPLETE_TIME_LIMIT = 10.0  # seconds per baseline's pinned solve

ROW_PARALLEL = re.compile(r"(c_proj|o_proj|down_proj|fc2|out_proj|dense_4h_to_h|wo)\.weight$")
BASELINES = ("data_parallel", "fsdp", "megatron_tp", "2d", "dcn_dp_ici_tp", "dcn_dp_ici_fsdp")


@dataclass(frozen=True, slots=True)
class Baseline:
    """A scored baseline: strategy per original node, modelled seconds, peak bytes, fits budget."""

    name: str
    strategies: tuple[int, ...]
    cost: float
    peak_memory: float
    feasible: bool


def baseline_axes(name: str, axis_names: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[str, ...] | None:
    """Per mesh axis the rule (``dp`` / ``fsdp`` / ``tp``) a baseline uses, or None if it does not apply."""
    n = len(axis_names)
    dcn = tuple(k == "dcn" for k in kinds)
    if name == "data_parallel":
        return ("dp",) * n
    if name == "fsdp":
        return ("fsdp",) * n
    if name == "megatron_tp":
        return ("tp",) * n
    if name == "2d":
        return ("dp",) * (n - 1) + ("tp",) if n >= 2 else None
    if name in ("dcn_dp_ici_tp", "dcn_dp_ici_fsdp"):
        if not any(dcn) or all(dcn):
            return None
        inner = "tp" if name.endswith("tp") else "fsdp"
        return tuple("dp" if d else inner for d in dcn)
    raise ValueError(f"unknown baseline {name!r}; allowed: {list(BASELINES)}")


def _param_placement(rule: str, name: str, shape: tuple[int, ...]) -> int | None:
    """Tensor dim a parameter is split on along an axis with this rule (None = replicated)."""
    if rule == "dp" or not shape:
        return None
    if rule == "fsdp":
        return max(range(len(shape)), key=lambda d: (shape[d], -d))
    if len(shape) == 2:
        return 1 if ROW_PARALLEL.search(name) else 0
    if len(shape) == 1 and not ROW_PARALLEL.search(name.replace(".bias", ".weight")) and "ln" not in name \
            and "norm" not in name:
        return 0  # column-parallel bias
    return None


def _spec(rules: tuple[str, ...], dim_of: list[int | None], shape: tuple[int, ...], sizes: tuple[int, ...]) -> Spec:
    spec: list = []
    for rule, d, n in zip(rules, dim_of, sizes):
        if d is None or n == 1:
            spec.append("R")
            continue
        f = math.prod(m for p, m in zip(spec, sizes) if p == ("S", d)) * n
        spec.append(("S", d) if shape[d] % f == 0 else "R")
    return tuple(spec)


def pinned_specs(model: Model, rules: tuple[str, ...]) -> dict[int, Spec]:
    """Spec of every parameter, optimizer-state slot and input under per-axis ``rules``."""
    g, sizes = model.graph, model.topology.axis_sizes
    out: dict[int, Spec] = {}
    state_of = {v: grp[0] for grp in g.alias_groups for v in grp}
    for node in g.nodes:
        if node.op != "placeholder":
            continue
        shape = node.out.shape
        if node.role == "input":
            dims = [0 if r in ("dp", "fsdp") and shape else None for r in rules]
        else:
            owner = g.nodes[state_of.get(node.id, node.id)]
            dims = [_param_placement(r, owner.name, shape) for r in rules]
        out[node.id] = _spec(rules, dims, shape, sizes)
    return out


def complete(folded: Folded, pinned: dict[int, int], sweeps: int = 2,
             time_limit: float | None = COMPLETE_TIME_LIMIT) -> list[int]:
    """Folded strategy vector: pinned groups fixed, the rest the cheapest the model finds.

    The free groups are chosen by the solver on the folded problem with the pinned ones
    fixed (``time_limit`` seconds; None: greedy only), warm-started from the greedy
    completion, which is kept when the solver finds nothing cheaper.
    """
    greedy = _greedy(folded, pinned, sweeps)
    if time_limit is None or not pinned:
        return greedy
    return _pinned_solve(folded, pinned, greedy, time_limit)


def _pinned_solve(folded: Folded, pinned: dict[int, int], greedy: list[int], time_limit: float) -> list[int]:
    p = folded.problem
    costs = list(p.node_costs)
    for g, s in pinned.items():
        c = np.asarray(costs[g], float)
        costs[g] = np.where(np.arange(len(c)) == s, c, np.inf)
    sub = replace(p, node_costs=costs)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sol = solve_problem(sub, time_limit, warm_start=greedy)
    except ValueError:  # no completion fits the memory budget: the greedy one is scored as infeasible
        return greedy
    if sol.strategies is None:
        return greedy
    found = [int(x) for x in sol.strategies]
    if any(found[g] != s for g, s in pinned.items()):
        return greedy
    cost_found, ok_found, _ = evaluate(p, found)
    cost_greedy, ok_greedy, _ = evaluate(p, greedy)
    return found if (ok_found, -cost_found) >= (ok_greedy, -cost_greedy) else greedy


def _greedy(folded: Folded, pinned: dict[int, int], sweeps: int) -> list[int]:
    """Pinned groups fixed, the rest greedy in execution order then coordinate descent."""
    p = folded.problem
    ng = folded.num_groups
    adj: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(p.num_nodes)]
    for (a, b), mat in zip(p.edges, p.edge_costs):
        mat = np.asarray(mat, float)
        adj[a].append((b, mat))       # cost[my p, their q]
        adj[b].append((a, mat.T))
    order = sorted(range(ng), key=lambda g: min(folded.members[g]))
    choice: list[int | None] = [None] * p.num_nodes
    for g, s in pinned.items():
        choice[g] = s

    def best(g: int) -> int:
        total = np.asarray(p.node_costs[g], float).copy()
        for other, mat in adj[g]:
            if other < ng and choice[other] is not None:
                total = total + mat[:, choice[other]]
        return int(np.argmin(np.where(np.isnan(total), np.inf, total)))

    for _ in range(1 + sweeps):
        for g in order:
            if g not in pinned:
                choice[g] = best(g)
    return [int(choice[g] if g < ng else choice[folded.group_of[folded.members[g][0]]]) for g in range(p.num_nodes)]


def run_baselines(model: Model, folded: Folded, kinds: tuple[str, ...]) -> list[Baseline]:
    """Score every baseline that applies to this mesh."""
    out = []
    for name in BASELINES:
        rules = baseline_axes(name, model.topology.axis_names, kinds)
        if rules is None:
            continue
        pinned: dict[int, int] = {}
        for v, spec in pinned_specs(model, rules).items():
            idx = next((i for i, s in enumerate(model.strategies[v]) if s.out_specs[0] == spec), 0)
            pinned[folded.group_of[v]] = idx
        full = folded.expand(complete(folded, pinned))
        cost, ok, peak = evaluate(model.problem, full)
        out.append(Baseline(name, tuple(full), cost, peak, ok))
    return out
