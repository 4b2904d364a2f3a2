"""Solve a deep model through its clustered graph, choosing activation checkpointing per layer.

:mod:`autoshard.cluster` keeps three copies of the model's repeated block (first, middle,
last of the interior run); the middle one stands for ``w`` layers. This module turns the
reduced graph's strategy problem into the full model's by weights (costs of a node and
of the edges into it times its layer count; memory times ``w`` for tensors live across
layers, once for a layer's transients), ties the three copies to one strategy, and
solves it for a number ``R`` of checkpointed middle layers:

* a checkpointed layer keeps only its input (the previous layer's output) from its
  forward to its backward; its other saved activations are freed and recomputed at the
  start of its backward, where one layer's copy is live again: saved tensors weigh
  ``w - R + 1`` instead of ``w``;
* the recomputation repeats the layer's forward, compute and forward resharding:
  forward nodes of the middle layer (and the edges into them) weigh ``w + R``.

``R = 0`` is tried first; if the memory budget is below every plan's peak, the
smallest feasible ``R`` is found by bisection (feasibility only grows with ``R``), and
a few larger ``R`` are tried in case recomputing more buys a cheaper layout; so is the
``R`` of any manual layout cheaper than the plans found (warm-started from it, so the
plan is never worse than the best manual layout). A user's
own ``torch.utils.checkpoint`` regions are in the trace already (their recomputation
is traced in the backward), so they are modelled as written.

Example:
    >>> import torch
    >>> from mesh import Mesh, topology_for
    >>> from autoshard.models import GPT2, GPT2Config
    >>> from autoshard.fx_builder import trace_training_step
    >>> with torch.device("meta"):
    ...     model = GPT2(GPT2Config(vocab=96, n_positions=16, n_embd=32, n_layer=6, n_head=2))
    >>> g = trace_training_step(model, (torch.zeros(8, 16, dtype=torch.long, device="meta"),) * 2)
    >>> m = Mesh(range(8), (2, 4), ("data", "model"), validate=False)
    >>> plan = solve_layered(g, m, topology_for(m, "h100"), time_limit=20)
    >>> plan.stats["remat"]["layers"], plan.stats["clustering"]["weight"]
    ([], 2)
"""
from __future__ import annotations

import math
import time
import warnings
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from mesh import Mesh, Topology

from autoshard.baselines import Baseline, baseline_axes, BASELINES, complete, pinned_specs
from autoshard.build import Model, build_model
from autoshard.cluster import Layers, Reduced, find_layers, reduce_graph
from autoshard.solver.evaluate import evaluate
from autoshard.fold import Folded, fold_ties
from autoshard.graph import Graph
from autoshard.plan import Plan
from autoshard.solver.problem import Problem
from autoshard.solver import MemoryBudgetError, solve_problem
from autoshard.tying import UnionFind

MIN_LAYERS = 3  # an interior run shorter than this is not clustered


@dataclass
class Layered:
    """A reduced model and what its weights need: per node its forward/saved/transient class."""

    reduced: Reduced
    model: Model
    ties: list[list[int]]
    forward: np.ndarray      # per reduced graph node: in the forward pass (an ancestor of the loss)
    saved: np.ndarray        # middle-layer activations kept for the backward (freed when checkpointed)
    transient: np.ndarray    # middle-layer tensors living only while the middle layer runs

    @property
    def width(self) -> int:
        return self.reduced.width

    def problem_at(self, remat: int, memory_limit: float | None) -> Problem:
        """The full model's problem with ``remat`` of the middle layers checkpointed."""
        p, g, red = self.model.problem, self.reduced.graph, self.reduced
        n, w = g.num_nodes, self.width
        wc = np.ones(p.num_nodes)
        wc[:n] = red.weight
        mid = np.zeros(n, bool)
        mid[red.middle] = True
        wc[:n][mid & self.forward] += remat
        for k, (u, _) in enumerate(self.model.fanouts):
            wc[n + k] = wc[u]
        wm = np.ones(p.num_nodes)
        wm[:n][mid & ~self.transient] = w
        wm[:n][self.saved] = w - remat + (1 if remat else 0)
        costs = [np.asarray(c, float) * wc[v] for v, c in enumerate(p.node_costs)]
        mems = [np.asarray(m, float) * wm[v] for v, m in enumerate(p.node_memory)]
        edges = [np.asarray(mat, float) * (wc[v] if v < n else wc[u]) for (u, v), mat in zip(p.edges, p.edge_costs)]
        return Problem(f"{p.name}/remat{remat}", costs, mems, p.intervals, p.edges, edges, memory_limit,
                       p.node_names)

    def saved_bytes(self, strategies: list[int]) -> float:
        """Bytes one middle layer saves for its backward under ``strategies`` (what checkpointing frees)."""
        mem = self.model.problem.node_memory
        return float(sum(mem[v][strategies[v]] for v in np.flatnonzero(self.saved)))


def prepare(graph: Graph, topo: Topology, memory_limit: float | None, pinned: dict | None = None) -> Layered | None:
    """Cluster ``graph`` and build its reduced model; None when it has under :data:`MIN_LAYERS` identical layers."""
    layers = find_layers(graph)
    if layers is None or layers.last - layers.first + 1 < MIN_LAYERS:
        return None
    try:
        red = reduce_graph(graph, layers)
    except ValueError:  # the layers interleave in execution order: no reduced graph keeps the schedule
        return None
    names = {n.name for n in red.graph.nodes if n.op == "placeholder"}
    pins = {k: v for k, v in (pinned or {}).items() if k in names}
    model = build_model(red.graph, topo, memory_limit, pinned=pins)
    return Layered(red, model, _ties(model, red), *_classes(red))


def _ties(model: Model, red: Reduced) -> list[list[int]]:
    """The model's ties plus the three kept copies of every block node (and of its reshard fan-out)."""
    uf = UnionFind(model.problem.num_nodes)
    for grp in model.ties:
        for v in grp[1:]:
            uf.union(grp[0], v)
    k = model.problem.num_strategies
    fan = {ref: model.graph.num_nodes + i for i, ref in enumerate(model.fanouts)}
    for trio in red.triples:
        for v in trio[1:]:
            if k(v) == k(trio[0]):
                uf.union(trio[0], v)
        for idx in range(len(model.graph.nodes[trio[0]].outputs)):
            fs = [fan.get((v, idx)) for v in trio]
            if None not in fs and len({k(f) for f in fs}) == 1:
                uf.union(fs[0], fs[1])
                uf.union(fs[0], fs[2])
    return uf.groups()


def _classes(red: Reduced) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g = red.graph
    n = g.num_nodes
    loss = g.outputs[0][0]
    forward = np.zeros(n, bool)
    stack = [loss]
    while stack:
        v = stack.pop()
        if not forward[v]:
            forward[v] = True
            stack.extend(s for s, _ in g.nodes[v].inputs)
    mid = np.zeros(n, bool)
    mid[red.middle] = True
    users = g.users()
    ops = np.array([nd.op != "placeholder" for nd in g.nodes])
    saved = np.zeros(n, bool)
    for v in red.middle:
        if not (ops[v] and forward[v]):
            continue
        read_back = any(not forward[u] for u in users[v])
        block_out = any(forward[u] and not mid[u] for u in users[v])
        saved[v] = read_back and not block_out
    run = np.concatenate([[0], np.cumsum(mid)])
    transient = np.zeros(n, bool)
    for v, (s, e) in enumerate(g.liveness()):
        transient[v] = mid[v] and e > s and run[e] - run[s] == e - s
    return forward, saved, transient


def _baselines(lay: Layered, kinds: tuple[str, ...], budget: float | None) -> list[dict]:
    """Every manual baseline at the fewest checkpointed layers that fit (activations completed without memory)."""
    free = fold_ties(lay.problem_at(0, None), lay.ties)
    model = replace(lay.model, problem=lay.problem_at(0, None))
    out = []
    for name in (*BASELINES, "fsdp_tp"):
        rules = _rules(name, model.topology.axis_names, kinds)
        if rules is None:
            continue
        pinned = {}
        for v, spec in pinned_specs(model, rules).items():
            idx = next((i for i, s in enumerate(model.strategies[v]) if s.out_specs[0] == spec), 0)
            pinned[free.group_of[v]] = idx
        full = free.expand(complete(free, pinned))
        best = None
        for r in range(lay.width + 1):
            cost, ok, peak = evaluate(lay.problem_at(r, budget), full)
            if ok or r == lay.width:
                best = dict(name=name, strategies=full, cost=cost, peak_memory=peak, feasible=ok, remat=r)
                break
        out.append(best)
    return out


def _rules(name: str, axes: tuple[str, ...], kinds: tuple[str, ...]) -> tuple[str, ...] | None:
    """Per-axis rules of a manual layout; ``fsdp_tp`` is FSDP on every axis but the last, TP on the last."""
    if name == "fsdp_tp":
        return ("fsdp",) * (len(axes) - 1) + ("tp",) if len(axes) >= 2 else None
    return baseline_axes(name, axes, kinds)


def solve_layered(graph: Graph, mesh: Mesh | None, topo: Topology, memory_budget: float | None = None,
                  time_limit: float = 60.0, *, kinds: tuple[str, ...] | None = None, verbose: bool = False,
                  pinned: dict | None = None, progress: Callable[[str], None] | None = None) -> Plan:
    """Plan ``graph`` through its clustered layers, checkpointing as few middle layers as memory allows.

    Raises:
        ValueError: the graph has no run of :data:`MIN_LAYERS` identical layers.
        MemoryBudgetError: even with every middle layer checkpointed no plan fits.
    """
    from autoshard.api import axis_kinds, make_plan

    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    lay = prepare(graph, topo, memory_budget, pinned)
    if lay is None:
        raise ValueError("the graph has no run of at least 3 identical layers to cluster")
    say(f"clustered: layers {lay.reduced.layers.first}..{lay.reduced.layers.last} of "
        f"{lay.reduced.layers.num_layers} identical; {graph.num_nodes} -> {lay.reduced.graph.num_nodes} nodes "
        f"({time.perf_counter() - t0:.1f} s)")
    kinds = kinds or axis_kinds(mesh, topo)
    base = _baselines(lay, kinds, memory_budget)
    say("baselines: " + ", ".join(f"{b['name']} {b['cost'] * 1e3:.1f} ms (remat {b['remat']})" for b in base))
    tried: dict[int, tuple] = {}

    def attempt(r: int) -> tuple | None:
        if r in tried:
            return tried[r]
        prob = lay.problem_at(r, memory_budget)
        folded = fold_ties(prob, lay.ties)
        ok = [b for b in base if evaluate(prob, b["strategies"])[1]]
        warm = folded.fold(min(ok, key=lambda b: evaluate(prob, b["strategies"])[0])["strategies"]) if ok else None
        if all(len(c) == 1 for c in folded.problem.node_costs) and not evaluate(prob, [0] * prob.num_nodes)[1]:
            say(f"remat {r}: the only plan does not fit")  # nothing to choose (a 1-device mesh)
            tried[r] = None
            return None
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                sol = solve_problem(folded.problem, time_limit, warm_start=warm, verbose=verbose)
        except MemoryBudgetError as err:
            say(f"remat {r}: no plan fits (minimum peak {err.min_peak / 2**30:.1f} GiB)")
            tried[r] = None
            return None
        if sol.strategies is None:
            tried[r] = None
            return None
        tried[r] = (sol, folded, prob)
        say(f"remat {r}: {sol.objective * 1e3:.2f} ms, peak {sol.peak_memory / 2**30:.1f} GiB, {sol.status.value} "
            f"({time.perf_counter() - t0:.1f} s)")
        return tried[r]

    w = lay.width
    if attempt(0) is None:
        if attempt(w) is None:
            raise MemoryBudgetError(f"memory budget {memory_budget / 2**30:.2f} GiB per device is below every plan's "
                                    f"peak even with all {w} middle layers checkpointed", memory_budget or 0.0,
                                    math.inf, False, [])
        lo, hi = 0, w  # lo infeasible, hi feasible
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if attempt(mid) is not None else (mid, hi)
        for extra in sorted({min(w, hi + max(1, w // 4)), min(w, hi + max(1, w // 2))} - {hi}):
            attempt(extra)
    done = [t[0].objective for t in tried.values() if t is not None]
    for b in sorted(base, key=lambda b: b["cost"]):  # a manual layout cheaper at its own R: solve at that R too
        if b["feasible"] and b["cost"] < min(done, default=math.inf):
            attempt(b["remat"])
    best_r = min((r for r, t in tried.items() if t is not None), key=lambda r: (tried[r][0].objective, r))
    sol, folded, prob = tried[best_r]
    strategies = folded.expand(sol.strategies)
    model = replace(lay.model, problem=prob)
    baselines = [Baseline(b["name"], tuple(b["strategies"]), b["cost"], b["peak_memory"], b["feasible"])
                 for b in base]
    plan = make_plan(model, folded, strategies, sol, baselines)
    _widen(plan, graph, lay, strategies, best_r, base, tried, time.perf_counter() - t0)
    return plan


def _widen(plan: Plan, graph: Graph, lay: Layered, strategies: list[int], remat: int, base: list[dict],
           tried: dict, seconds: float) -> None:
    """Give the plan every dropped layer's placements, and the clustering and checkpointing facts."""
    red = lay.reduced
    spec = {n.name: plan.placements[n.name] for n in red.graph.nodes if n.op == "placeholder"}
    for n in graph.nodes:
        if n.op == "placeholder" and n.name not in plan.placements:
            rep = red.graph.nodes[red.of_full[n.id]].name
            plan.placements[n.name] = spec[rep]
            plan.shapes[n.name] = n.out.shape
            plan.roles[n.name] = n.role
        elif n.op != "placeholder" and n.name not in plan.activations:  # a dropped layer's op: the middle one's layout
            rep = red.graph.nodes[red.of_full[n.id]].name
            if rep in plan.activations:
                plan.activations[n.name] = plan.activations[rep]
                plan.shapes[n.name] = n.out.shape
    layers = red.layers
    middle = list(range(layers.first + 1, layers.last))
    chosen = _spread(middle, remat)
    fwd_cost = sum(float(lay.model.problem.node_costs[v][strategies[v]]) for v in red.middle if lay.forward[v])
    for b in base:
        plan.baselines[b["name"]]["remat"] = b["remat"]
    plan.stats["clustering"] = {"layers": layers.num_layers, "identical": [layers.first, layers.last],
                                "kept": list(red.kept_layers), "weight": red.width, "prefix": layers.prefix,
                                "graph_nodes": graph.num_nodes, "reduced_nodes": red.graph.num_nodes,
                                "seconds": seconds}
    plan.stats["remat"] = {"layers": chosen, "count": remat, "candidates": middle,
                           "saved_bytes_per_layer": lay.saved_bytes(strategies),
                           "recompute_s_per_layer": fwd_cost,
                           "tried": {r: (None if t is None else t[0].objective) for r, t in sorted(tried.items())}}


def _spread(layers: list[int], count: int) -> list[int]:
    """``count`` of ``layers`` spread evenly (every layer when count == len)."""
    if count <= 0:
        return []
    step = len(layers) / count
    return sorted({layers[int(i * step)] for i in range(count)})
