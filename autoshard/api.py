"""``autoshard.solve``: graph + mesh + topology -> explained :class:`Plan`.

Builds the strategy problem (:mod:`autoshard.build`), folds its ties
(:mod:`autoshard.fold`), scores the manual baselines (:mod:`autoshard.baselines`),
solves with :func:`autoshard.solver.solve_problem` warm-started from the best
baseline, and reads the solution back into a Plan. Plans are cached in memory and on
disk (:mod:`autoshard.cache`) by (graph fingerprint, mesh, topology, budget, time limit).

Example:
    >>> import torch
    >>> from mesh import Mesh, topology_for
    >>> from autoshard.models import GPT2, GPT2Config
    >>> from autoshard.fx_builder import trace_training_step
    >>> model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    >>> g = trace_training_step(model, (torch.zeros(8, 8, dtype=torch.long),) * 2)
    >>> m = Mesh(range(8), (8,), ("data",))
    >>> plan = solve(g, m, topology_for(m, "tpu-v5e"), time_limit=20)
    >>> plan.status, plan.objective <= plan.best_baseline()[1]
    ('OPTIMAL', True)
"""
from __future__ import annotations

import os
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from mesh import Mesh, Topology, topology_for

from autoshard.baselines import Baseline, run_baselines
from autoshard.build import Model, build_model
from autoshard.cache import PlanCacheWarning, open_cache, plan_key, plan_mismatch
from autoshard.solver.evaluate import evaluate
from autoshard.fold import Folded, fold_ties
from autoshard.graph import Graph
from autoshard.guard import replicated_strategies, report as guard_report
from autoshard.plan import Decision, Plan
from autoshard.solver import MemoryBudgetError, solve_problem

_CACHE: dict[tuple, Plan] = {}
# how solve() answered: "solves" (ran the solver), "memory_hits", "disk_hits"
STATS: Counter[str] = Counter()
_SLOW_LINKS = ("dcn", "infiniband")
CLUSTER_MIN_LAYERS = 4  # cluster (cluster=None) from this many identical interior layers: below, little to gain
PROGRESS_AFTER_S = 5.0  # the default progress reporter stays silent for solves shorter than this


class _Progress:
    """Progress lines to stderr, but only once a solve has run :data:`PROGRESS_AFTER_S` (earlier lines
    are held back and written then), so short solves print nothing."""

    def __init__(self) -> None:
        self.t0, self.held, self.live = time.perf_counter(), [], False

    def __call__(self, msg: str) -> None:
        line = f"autoshard: {msg}"
        if not self.live and time.perf_counter() - self.t0 < PROGRESS_AFTER_S:
            self.held.append(line)
            return
        if not self.live:
            self.live = True
            for held in self.held:
                print(held, file=sys.stderr)
        print(line, file=sys.stderr, flush=True)


def _clusters(graph: Graph, cluster: bool | None, pins: tuple = ()) -> bool:
    """Whether :func:`solve` takes the clustered path (``cluster``: True forces it, False never, None when it
    pays and no user pin names a parameter of a layer the clustering drops)."""
    if cluster is False:
        return False
    from autoshard.cluster import find_layers

    layers = find_layers(graph)
    run = 0 if layers is None else layers.last - layers.first + 1
    if cluster is True:
        if run < 3:
            raise ValueError(f"cluster=True: the graph has no run of at least 3 identical layers (found {run})")
        return True
    if run < CLUSTER_MIN_LAYERS:
        return False
    names = {k for k, _ in pins}
    return not any(n.name in names for n in graph.nodes
                   if n.op == "placeholder" and layers.first + 2 <= layers.label[n.id] <= layers.last - 1)


def axis_kinds(mesh: Mesh | None, topo: Topology) -> tuple[str, ...]:
    """``"dcn"`` or ``"ici"`` per axis: from a HybridMesh, else from the topology's link kinds."""
    kind = getattr(mesh, "axis_kind", None)
    if kind is not None:
        return tuple("dcn" if kind(i) in ("dcn", "ici+dcn") else "ici" for i in range(len(topo.axis_sizes)))
    return tuple("dcn" if link.kind in _SLOW_LINKS else "ici" for link in topo.links)


def solve(graph: Graph, mesh: Mesh | None, topology: Topology | str = "tpu-v5e",
          memory_budget: float | None = None, time_limit: float = 60.0, *, verbose: bool = False,
          cache: bool = True, cache_dir: str | os.PathLike | bool | None = None,
          pinned: Mapping[str, Any] | None = None, cluster: bool | None = None,
          progress: Callable[[str], None] | bool | None = None) -> Plan:
    """Choose a sharding for every tensor of ``graph`` minimizing modelled step time.

    Args:
        graph: the training step (e.g. from :func:`autoshard.fx_builder.trace_training_step`).
        mesh: the device mesh (a :class:`mesh.HybridMesh` marks its DCN axes); may be None
            when ``topology`` is a :class:`mesh.Topology`.
        topology: a Topology or a preset name for :func:`mesh.topology_for`.
        memory_budget: bytes per device (None: unlimited).
        time_limit: seconds for the solver; on timeout the best plan and its gap are
            returned with a :class:`autoshard.solver.SolverTimeoutWarning`.
        cache: reuse plans (in memory, and on disk per ``cache_dir``).
        cache_dir: plan cache directory (:mod:`autoshard.cache`); None: the default
            (``$XLA_DTENSOR_CACHE_DIR/plans`` or ``~/.cache/xla_dtensor/plans``); False: memory only.
        pinned: placeholder name -> :data:`autoshard.spec.Spec` the plan must keep (user
            hints); its alias group (gradient, optimizer state) follows.
        cluster: layer clustering (:func:`autoshard.layered.solve_layered`: repeated layers
            solved once, activation checkpointing chosen by the plan). None: when the graph
            has at least :data:`CLUSTER_MIN_LAYERS` identical interior layers; True: always
            (ValueError without 3); False: never.
        progress: a callable taking one line per solver phase (clustered path), False for
            none; None prints them to stderr once a solve has run :data:`PROGRESS_AFTER_S`.

    Raises:
        MemoryBudgetError: the budget is below the smallest feasible plan's peak; the
            message names the minimum and the tensors that dominate it.
    """
    topo = topology_for(mesh, topology) if isinstance(topology, str) else topology
    if memory_budget is not None and not memory_budget > 0:
        raise ValueError(f"memory_budget must be a positive number of bytes or None, got {memory_budget!r}")
    pins = tuple(sorted((str(k), tuple(v)) for k, v in (pinned or {}).items()))
    clustered = _clusters(graph, cluster, pins)
    key = (graph.fingerprint(), None if mesh is None else hash(mesh), topo, memory_budget, time_limit, pins, clustered)
    if cache and key in _CACHE:
        STATS["memory_hits"] += 1
        return _CACHE[key]
    disk = open_cache(cache_dir) if cache else None
    disk_key = plan_key(graph, mesh, topo, memory_budget, time_limit, pins + (("clustered", clustered),) * clustered) \
        if disk is not None else ""
    if disk is not None and (hit := disk.get(disk_key)) is not None:
        problem = plan_mismatch(hit, graph, topo, mesh)
        if problem is None:
            STATS["disk_hits"] += 1
            _CACHE[key] = hit
            return hit
        warnings.warn(f"cached plan {disk.path(disk_key)} does not fit this graph and mesh ({problem}); "
                      f"solving again", PlanCacheWarning, stacklevel=2)
    STATS["solves"] += 1
    if clustered:
        from autoshard.layered import solve_layered

        say = _Progress() if progress is None else (progress or None)
        plan = solve_layered(graph, mesh, topo, memory_budget, time_limit, verbose=verbose, pinned=dict(pins),
                             progress=say)
    else:
        plan = _solve_flat(graph, mesh, topo, memory_budget, time_limit, verbose, pins)
    if cache:
        _CACHE[key] = plan
    if disk is not None:
        disk.put(disk_key, plan)
    return plan


def _solve_flat(graph: Graph, mesh: Mesh | None, topo: Topology, memory_budget: float | None, time_limit: float,
                verbose: bool, pins: tuple) -> Plan:
    """The unclustered solve: every node of ``graph`` a decision (ties folded)."""
    model = build_model(graph, topo, memory_budget, pinned=dict(pins))
    folded = fold_ties(model.problem, model.ties)
    baselines = run_baselines(model, folded, axis_kinds(mesh, topo))
    feasible = [b for b in baselines if b.feasible]
    warm = folded.fold(min(feasible, key=lambda b: b.cost).strategies) if feasible else None
    try:
        sol = solve_problem(folded.problem, time_limit, warm_start=warm, verbose=verbose)
    except MemoryBudgetError as err:
        raise _named_memory_error(err, folded, model) from err
    if sol.strategies is None:
        raise RuntimeError(f"solver found no plan: {sol.status.value} after {sol.solve_time:.1f}s "
                           f"(time_limit={time_limit}); raise the time limit or the memory budget")
    strategies = folded.expand(sol.strategies)
    return make_plan(model, folded, strategies, sol, baselines)


def _named_memory_error(err: MemoryBudgetError, folded: Folded, model: Model) -> MemoryBudgetError:
    names = []
    for v, _, nbytes in err.top_nodes:
        members = folded.members[v] if v < len(folded.members) else []
        label = ", ".join(model.graph.nodes[m].name for m in members[:3])
        more = f" and {len(members) - 3} more" if len(members) > 3 else ""
        names.append(f"{label}{more} ({nbytes / 2**20:.1f} MiB)")
    msg = (f"memory budget {err.limit / 2**30:.4f} GiB per device is below the minimum peak memory of any "
           f"plan, {err.min_peak / 2**30:.4f} GiB{'' if err.proven else ' (best found)'}; the peak is dominated "
           f"by: {'; '.join(names) or 'unknown'}")
    return MemoryBudgetError(msg, err.limit, err.min_peak, err.proven, err.top_nodes)


def _neighbour_costs(folded: Folded, choice: list[int]) -> list[np.ndarray]:
    """Per decision group: its cost for every strategy with all other groups held fixed."""
    p, ng = folded.problem, folded.num_groups
    totals = [np.asarray(c, float).copy() for c in p.node_costs[:ng]]
    for (a, b), mat in zip(p.edges, p.edge_costs):
        if a < ng and b < ng:
            mat = np.asarray(mat, float)
            totals[a] += mat[:, choice[b]]
            totals[b] += mat[choice[a], :]
    return totals


def make_plan(model: Model, folded: Folded, strategies: list[int], sol: Any, baselines: list[Baseline]) -> Plan:
    """Read a per-node strategy vector back into a :class:`Plan`."""
    g, prob, topo = model.graph, model.problem, model.topology
    spec_of = lambda v: model.strategies[v][strategies[v]].out_specs[0]  # noqa: E731
    placements = {n.name: spec_of(n.id) for n in g.nodes if n.op == "placeholder"}
    activations = {n.name: spec_of(n.id) for n in g.nodes
                   if n.op != "placeholder" and model.follows[n.id] is None}
    comm = np.zeros(g.num_nodes)
    for (u, v), mat in zip(prob.edges, prob.edge_costs):  # a fan-out's input reshard counts for its producer
        comm[v if v < g.num_nodes else u] += mat[strategies[u], strategies[v]]
    rows = []
    for n in g.nodes:
        c = float(prob.node_costs[n.id][strategies[n.id]])
        if c > 0 or comm[n.id] > 0:
            rows.append((n.name, n.op, model.strategies[n.id][strategies[n.id]].name, c, float(comm[n.id]),
                         float(prob.node_memory[n.id][strategies[n.id]])))
    objective, _, peak = evaluate(prob, strategies)
    mem = {"peak": peak}
    for role in ("param", "opt_state", "grad"):
        mem[role] = float(sum(prob.node_memory[n.id][strategies[n.id]] for n in g.nodes if n.role == role))
    fchoice = folded.fold(strategies)
    totals = _neighbour_costs(folded, fchoice)
    decisions = []
    for n in g.nodes:
        if n.role != "param":
            continue
        grp = folded.group_of[n.id]
        tot, chosen = totals[grp], fchoice[grp]
        alts = [(tot[p], p) for p in range(len(tot))
                if model.strategies[n.id][p].out_specs[0] != spec_of(n.id)]
        best_alt = min(alts) if alts else None
        decisions.append(Decision(
            n.name, spec_of(n.id),
            None if best_alt is None else model.strategies[n.id][best_alt[1]].out_specs[0],
            0.0 if best_alt is None else float(best_alt[0] - tot[chosen]),
            float(folded.problem.node_costs[grp][chosen]), float(tot[chosen] - folded.problem.node_costs[grp][chosen])))
    guard = guard_report(model, strategies, float(objective), baselines)
    base = {b.name: {"cost": b.cost, "peak_memory": b.peak_memory, "feasible": b.feasible} for b in baselines}
    rep_cost, rep_ok, rep_peak = evaluate(prob, replicated_strategies(model))
    base["replicated"] = {"cost": rep_cost, "peak_memory": rep_peak, "feasible": rep_ok}
    return Plan(
        mesh_axes=tuple(topo.axis_names), mesh_shape=tuple(topo.axis_sizes), topology=topo.name,
        placements=placements, activations=activations,
        shapes={n.name: n.out.shape for n in g.nodes}, roles={n.name: n.role for n in g.nodes if n.op == "placeholder"},
        node_costs=rows, memory=mem, decisions=decisions,
        baselines=base,
        objective=float(objective), bound=float(min(sol.bound, objective)), gap=float(sol.gap),
        status=sol.status.value, solve_time=float(sol.solve_time),
        stats={"graph_nodes": g.num_nodes, "problem_nodes": prob.num_nodes, "edges": len(prob.edges),
               "merged_groups": model.untied_groups, "decision_groups": folded.num_groups, "folded_nodes": folded.problem.num_nodes,
               "folded_edges": len(folded.problem.edges), "unknown_ops": sorted(set(model.unknown_ops)),
               "generic_ops": dict(sorted(model.generic_ops.items())), "guard": guard,
               "phase": sol.phase, **{k: v for k, v in sol.stats.items() if isinstance(v, (int, float, str))}})


def clear_cache() -> None:
    """Forget cached plans."""
    _CACHE.clear()
