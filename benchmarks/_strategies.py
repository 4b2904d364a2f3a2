"""Sharding strategies for the auto-vs-manual benchmark, as one autoshard ``Spec`` per tensor.

A strategy maps every parameter, optimizer-state slot and input of a traced training
step (the placeholders of an :class:`autoshard.Graph`) to a placement per mesh axis.
The manual ones follow a per-axis rule, as :mod:`autoshard.baselines` does:

* ``dp``: parameters replicated, inputs split on the batch dim;
* ``fsdp``: parameters split on their largest dim, inputs on the batch dim;
* ``tp`` (Megatron): column-parallel weights split on the output dim (weight dim 0 and
  bias), row-parallel weights on the input dim (weight dim 1), embeddings on the
  vocabulary; the rest and the inputs replicated. Which layer is row-parallel comes from
  the model's :class:`TPPlan` (the pairing differs per architecture, e.g. Llama's ``w2``,
  ViT's ``proj``, every second layer of a plain MLP).

The same specs are scored by autoshard's cost model (:func:`modelled`) and applied to a
real model with ``mark_sharding`` (:func:`apply_specs`), so the modelled and the measured
runs compare the same layouts.

Example:
    >>> from autoshard.baselines import baseline_axes
    >>> baseline_axes("2d", ("dcn", "ici"), ("dcn", "ici"))
    ('dp', 'tp')
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from autoshard.baselines import BASELINES, baseline_axes, complete
from autoshard.build import Model, build_model
from autoshard.solver.evaluate import evaluate
from autoshard.fold import fold_ties
from autoshard.graph import Graph
from autoshard.spec import Spec, partition_spec

MANUAL = BASELINES


@dataclass(frozen=True, slots=True)
class TPPlan:
    """Megatron roles by parameter-name regex: ``row`` (input dim) and ``vocab`` (dim 0 of an embedding).

    Every other 2-D weight (and its 1-D bias) is column-parallel unless ``replicate`` matches.
    ``transposed`` weights are stored ``[in, out]`` (HF GPT-2's ``Conv1D``): their column
    split is dim 1 and their row split dim 0.
    """

    row: str
    vocab: str = r"$^"
    replicate: str = r"norm|ln_|pos|cls_token|wpe"
    transposed: str = r"$^"

    def role(self, name: str, ndim: int) -> str:
        weight = name[:-len("bias")] + "weight" if name.endswith("bias") else name
        if re.search(self.replicate, name) or ndim == 0:
            return "rep"
        if re.search(self.vocab, name):
            return "vocab"
        if re.search(self.row, weight):
            return "rep" if name.endswith("bias") else "row"
        return "col" if ndim in (1, 2) else "rep"


def _dim(rule: str, role: str, name: str, shape: tuple[int, ...], tp: TPPlan) -> int | None:
    """Tensor dim split along one mesh axis with ``rule`` (None: replicated)."""
    if not shape:
        return None
    if role == "input":
        return 0 if rule in ("dp", "fsdp") else None
    if rule == "dp":
        return None
    if rule == "fsdp":
        return max(range(len(shape)), key=lambda d: (shape[d], -d))
    kind = tp.role(name, len(shape))
    if len(shape) == 2 and re.search(tp.transposed, name):
        return {"rep": None, "vocab": 0, "row": 0, "col": 1}[kind]
    return {"rep": None, "vocab": 0, "row": 1, "col": 0}[kind]


def manual_specs(graph: Graph, strategy: str, axis_sizes: tuple[int, ...], kinds: tuple[str, ...],
                 tp: TPPlan) -> dict[str, Spec] | None:
    """Spec of every placeholder of ``graph`` under a manual strategy (None if it does not apply)."""
    rules = baseline_axes(strategy, tuple(f"axis{i}" for i in range(len(kinds))), kinds)
    if rules is None:
        return None
    out: dict[str, Spec] = {}
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        owner = node.name.split(":", 1)[-1]  # exp_avg:<param> follows its parameter
        shape = node.out.shape
        spec: list[Any] = []
        for rule, n in zip(rules, axis_sizes):
            d = _dim(rule, node.role, owner, shape, tp)
            factor = math.prod(m for p, m in zip(spec, axis_sizes) if p == ("S", d)) * n
            spec.append("R" if d is None or n == 1 or shape[d] % factor else ("S", d))
        out[node.name] = tuple(spec)
    return out


def auto_specs(plan: Any) -> dict[str, Spec]:
    """The placeholders' specs of an autoshard Plan."""
    return dict(plan.placements)


def step_flops(model: Model) -> float:
    """FLOPs of the whole step (forward, backward, optimizer) as autoshard's rules count them."""
    return float(sum(r.flops for r in model.rules))


def completed(model: Model, specs: dict[str, Spec]) -> list[int]:
    """Strategy index of every node of ``model`` with its placeholders pinned to ``specs``.

    Activations are completed by the cost model (:func:`autoshard.baselines.complete`),
    as the built-in baselines are.
    """
    folded = fold_ties(model.problem, model.ties)
    pinned: dict[int, int] = {}
    for node in model.graph.nodes:
        if node.op == "placeholder" and node.name in specs:
            options = model.strategies[node.id]
            idx = next((i for i, s in enumerate(options) if s.out_specs[0] == specs[node.name]), None)
            if idx is None:
                raise ValueError(f"{node.name}: spec {specs[node.name]} is not among its strategies")
            pinned[folded.group_of[node.id]] = idx
    return folded.expand(complete(folded, pinned))


def modelled(model: Model, specs: dict[str, Spec]) -> tuple[float, float, bool]:
    """(modelled step seconds, peak bytes per device, fits the budget) of ``specs`` on ``model``."""
    cost, ok, peak = evaluate(model.problem, completed(model, specs))
    return cost, peak, ok


def build(graph: Graph, topology: Any, budget: float | None) -> Model:
    """autoshard's strategy problem for ``graph`` on ``topology``."""
    return build_model(graph, topology, budget)


def apply_specs(module: Any, inputs: list[Any], specs: dict[str, Spec], mesh: Any) -> None:
    """``mark_sharding`` every parameter and input of a lazy-device model with its spec."""
    import xla_dtensor.spmd as xs

    axes = mesh.jax_axis_names
    for name, p in module.named_parameters():
        xs.mark_sharding(p, mesh, partition_spec(specs[name], axes, p.dim()))
    for i, t in enumerate(inputs):
        xs.mark_sharding(t, mesh, partition_spec(specs[f"input{i}"], axes, t.dim()))


def apply_state_specs(optimizer: Any, module: Any, specs: dict[str, Spec], mesh: Any) -> None:
    """Annotate the optimizer's moment buffers with their parameters' planned specs."""
    import xla_dtensor.spmd as xs

    axes = mesh.jax_axis_names
    for name, p in module.named_parameters():
        for slot in ("exp_avg", "exp_avg_sq"):
            buf = optimizer.state.get(p, {}).get(slot)
            spec = specs.get(f"{slot}:{name}", specs[name])
            if buf is not None:
                xs.mark_sharding(buf, mesh, partition_spec(spec, axes, buf.dim()))
