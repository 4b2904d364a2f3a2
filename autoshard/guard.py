"""The plan-quality guard: does AUTO's plan beat replicating, and if not, what stopped it?

On a mesh of more than one device a plan that is no better than running replicated
(every tensor whole on every device) or than a manual baseline, or that replicates
every parameter and input, deserves a reason. The report compares the plan per graph
node (the node's compute plus the resharding on its input edges) with the cheapest
reference that shards more (data parallelism; if the plan ties it, the best baseline
that shards parameters) and names the nodes where that reference pays most beyond the
plan: an op that gathers the batch, an opaque op, the gradient reductions of a model
too small for them to pay. These are the ops that forced the plan;
:meth:`autoshard.plan.Plan.explain` prints them.

Example:
    >>> from autoshard.guard import verdict
    >>> verdict({"devices": 8, "all_replicated": True, "ties": ["replicated"], "dp_feasible": True, "dp_extra": 1e-6})
    'no better than replicated; every parameter and input is replicated on 8 devices (data parallel is feasible, modelled 0.0010 ms slower)'
"""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from autoshard.solver.evaluate import evaluate
from autoshard.spec import spec_str

TOP = 5
_REL = 1e-6  # a plan within this relative margin of a reference ties it


def replicated_strategies(model: Any) -> list[int]:
    """Per problem node, the index of its strategy that keeps everything whole (0 if it has none)."""
    out = []
    for ss in model.strategies:
        idx = next((i for i, s in enumerate(ss) if all(p == "R" for spec in s.out_specs + s.in_specs for p in spec)),
                   None)
        out.append(0 if idx is None else idx)
    return out


def node_costs(problem: Any, strategies: Sequence[int], num_graph_nodes: int) -> np.ndarray:
    """Per problem node: its own cost plus its input edges' (a fan-out's go to its producer)."""
    c = np.array([float(problem.node_costs[v][strategies[v]]) for v in range(problem.num_nodes)])
    for (u, v), mat in zip(problem.edges, problem.edge_costs):
        c[v if v < num_graph_nodes else u] += float(np.asarray(mat)[strategies[u], strategies[v]])
    return c


def report(model: Any, strategies: Sequence[int], objective: float, baselines: Sequence[Any]) -> dict[str, Any]:
    """The guard's findings for a solved plan (JSON-ready; stored as ``plan.stats["guard"]``).

    ``ties``: the references (``replicated`` and the baselines) the plan is no better
    than. When it ties one or replicates every parameter and input on several devices,
    ``forced_by`` lists the nodes where the cheapest reference that shards more than the
    plan (data parallelism, else the best parameter-sharding baseline) pays most beyond
    the plan, ``reference`` names it and ``ref_extra`` is its extra modelled time.
    """
    g, prob = model.graph, model.problem
    devices = math.prod(model.topology.axis_sizes)
    rep = replicated_strategies(model)
    rep_cost, rep_ok, _ = evaluate(prob, rep)
    placed = [n for n in g.nodes if n.op == "placeholder" and n.role in ("param", "input") and n.out.ndim]
    all_rep = all(all(p == "R" for p in model.strategies[n.id][strategies[n.id]].out_specs[0]) for n in placed)
    refs = {"replicated": (rep_cost, bool(rep_ok), rep)}
    refs.update({b.name: (b.cost, b.feasible, list(b.strategies)) for b in baselines})
    ties = [name for name, (cost, ok, _) in refs.items()
            if ok and math.isfinite(cost) and objective >= cost * (1 - _REL)]
    out: dict[str, Any] = {"devices": devices, "replicated_cost": float(rep_cost), "all_replicated": all_rep,
                           "ties": ties, "dp_feasible": bool(refs.get("data_parallel", (0, False))[1])}
    if "data_parallel" in refs:
        out["dp_extra"] = float(refs["data_parallel"][0] - objective)
    if devices > 1 and (ties or all_rep):
        ref = _reference(refs, ties)
        if ref is not None:
            mine = node_costs(prob, strategies, g.num_nodes)
            theirs = node_costs(prob, refs[ref][2], g.num_nodes)
            out.update(reference=ref, ref_extra=float(refs[ref][0] - objective),
                       forced_by=_top(model, theirs - mine, refs[ref][2]))
        out["unsplittable"] = unsplittable(model)
    return out


def unsplittable(model: Any, top: int = TOP) -> list[dict[str, Any]]:
    """Ops that cannot split at all on this mesh (every strategy whole), largest input first.

    A sort over all tokens, an opaque op: data parallelism must gather the batch before
    them, so they are the usual root of a plan that stays replicated.
    """
    g = model.graph
    found: dict[str, dict[str, Any]] = {}
    for node in g.nodes:
        if node.op == "placeholder" or not node.inputs:
            continue
        ss = model.strategies[node.id]
        if any(p != "R" for s in ss for spec in s.in_specs + s.out_specs for p in spec):
            continue
        nbytes = max(node.input_meta(g, i).nbytes for i in range(len(node.inputs)))
        if nbytes == 0 or max(node.input_meta(g, i).numel for i in range(len(node.inputs))) < len(ss[0].in_specs[0]):
            continue
        row = found.setdefault(node.op, {"op": node.op, "count": 0, "bytes": 0, "example": node.name})
        row["count"] += 1
        if nbytes > row["bytes"]:
            row["bytes"], row["example"] = nbytes, node.name
    return sorted(found.values(), key=lambda r: -r["bytes"])[:top]


def _reference(refs: dict[str, tuple], ties: list[str]) -> str | None:
    """Data parallelism unless the plan ties it, else the cheapest feasible untied sharding baseline."""
    if "data_parallel" in refs and refs["data_parallel"][1] and "data_parallel" not in ties:
        return "data_parallel"
    others = [(cost, name) for name, (cost, ok, _) in refs.items()
              if ok and name not in ties and name not in ("replicated", "data_parallel") and math.isfinite(cost)]
    return min(others)[1] if others else None


def _top(model: Any, delta: np.ndarray, ref: Sequence[int]) -> list[dict[str, Any]]:
    g, names, opaque = model.graph, model.problem.node_names, set(model.unknown_ops)
    rows = []
    for v in np.argsort(-delta)[:TOP]:
        if delta[v] <= 0:
            break
        node = g.nodes[v] if v < g.num_nodes else None
        op = node.op if node is not None else "reshard"
        why = "opaque op (no rule): runs whole, its inputs gathered" if op in opaque else _why(model, int(v), ref)
        rows.append({"node": names[v] if v < len(names) else str(v), "op": op, "extra_s": float(delta[v]), "why": why})
    return rows


def _why(model: Any, v: int, ref: Sequence[int]) -> str:
    """What the reference plan pays at node ``v``: a gradient reduction or its costliest input resharding."""
    g, prob = model.graph, model.problem
    if v >= g.num_nodes:
        return "resharding a tensor once for all its readers"
    node = g.nodes[v]
    owner = {r: pid for pid, r in g.grads.items()}
    grads = [g.nodes[owner[(v, i)]].name for i in range(len(node.outputs)) if (v, i) in owner]
    if grads:
        return f"produces the gradient of {grads[0]}, reduced for the optimizer"
    best, text = 0.0, "its compute"
    for (u, w), mat in zip(prob.edges, prob.edge_costs):
        cost = float(mat[ref[u], ref[w]]) if v in (u, w) else 0.0
        if cost <= best:
            continue
        if w == v:
            src = model.strategies[u][ref[u]].out_specs[0]
            name = prob.node_names[u] if u < len(prob.node_names) else str(u)
            best, text = cost, f"reshards its input from {name} ({spec_str(src)} -> what it needs)"
        elif w >= g.num_nodes:  # v's output, resharded once for its readers
            spec = model.strategies[w][ref[w]].out_specs[0]
            readers = sorted({n.op for n in g.nodes if any(r[0] == v for r in n.inputs)})
            best, text = cost, f"its output is resharded to {spec_str(spec)} for {', '.join(readers[:3])}"
    return text


def verdict(guard: dict[str, Any]) -> str | None:
    """One line for ``explain()`` when the plan ties a baseline on a multi-device mesh, else None."""
    if guard.get("devices", 1) <= 1 or not (guard.get("ties") or guard.get("all_replicated")):
        return None
    parts = [f"no better than {', '.join(guard['ties'])}"] if guard.get("ties") else []
    if guard.get("all_replicated"):
        extra = guard.get("dp_extra", 0.0)
        dp = f" (data parallel is feasible, modelled {extra * 1e3:.4f} ms slower)" \
            if guard.get("dp_feasible") and extra > 0 else ""
        parts.append(f"every parameter and input is replicated on {guard['devices']} devices{dp}")
    return "; ".join(parts)
