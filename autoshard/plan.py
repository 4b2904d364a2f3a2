"""Plan: the chosen placements, their modelled cost, the baselines, and why.

Placements are plain values (see :mod:`autoshard.spec`): one ``"R"``, ``"P"`` or
``("S", dim)`` per mesh axis, DTensor's ``Replicate()/Partial()/Shard(dim)``.
:meth:`Plan.partition_spec` gives the JAX/GSPMD form. ``to_json``/``from_json``
round-trip everything.

Example:
    >>> p = Plan(mesh_axes=("data",), mesh_shape=(8,), topology="tpu-v5e",
    ...          placements={"w": (("S", 0),)}, shapes={"w": (16, 4)})
    >>> p.partition_spec("w"), Plan.from_json(p.to_json()) == p
    (('data', None), True)
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from autoshard.spec import Spec, from_json, partition_spec, spec_str, to_json


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a parameter got its placement: the best alternative and what it would add (s)."""

    name: str
    chosen: Spec
    runner_up: Spec | None
    saving: float          # runner-up's modelled step time minus the chosen one's, all else fixed
    compute: float         # compute seconds of the tensor's group under the chosen strategy
    comm: float            # resharding seconds on the group's edges under the chosen strategy


@dataclass(frozen=True)
class Plan:
    """A sharding plan for a training step (see module docstring)."""

    mesh_axes: tuple[str, ...]
    mesh_shape: tuple[int, ...]
    topology: str
    placements: dict[str, Spec] = field(default_factory=dict)      # params, optimizer state, inputs
    activations: dict[str, Spec] = field(default_factory=dict)     # outputs of decision ops
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    node_costs: list[tuple[str, str, str, float, float, float]] = field(default_factory=list)
    memory: dict[str, float] = field(default_factory=dict)         # bytes per device
    decisions: list[Decision] = field(default_factory=list)
    baselines: dict[str, dict[str, float]] = field(default_factory=dict)
    objective: float = 0.0
    bound: float = 0.0
    gap: float = 0.0
    status: str = "OPTIMAL"
    solve_time: float = 0.0
    stats: dict[str, Any] = field(default_factory=dict)

    def partition_spec(self, name: str) -> tuple:
        """JAX ``PartitionSpec`` entries of tensor ``name`` (``Partial`` axes are dropped)."""
        spec = self.placements.get(name, self.activations.get(name))
        if spec is None:
            raise KeyError(f"no placement for {name!r}; known: {sorted(self.placements)[:10]}...")
        return partition_spec(spec, self.mesh_axes, len(self.shapes.get(name, ())))

    def spec_text(self, name: str) -> str:
        return spec_str(self.placements.get(name, self.activations.get(name, ())))

    def best_baseline(self) -> tuple[str, float] | None:
        ok = {k: v["cost"] for k, v in self.baselines.items() if v.get("feasible", True)}
        return min(ok.items(), key=lambda kv: kv[1]) if ok else None

    def explain(self, limit: int = 40) -> str:
        """A human-readable report (tables rendered with rich)."""
        from autoshard.explain import render

        return render(self, limit)

    def to_json(self) -> str:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["placements"] = {k: to_json(v) for k, v in self.placements.items()}
        d["activations"] = {k: to_json(v) for k, v in self.activations.items()}
        d["decisions"] = [dict(asdict(x), chosen=to_json(x.chosen),
                               runner_up=None if x.runner_up is None else to_json(x.runner_up))
                          for x in self.decisions]
        return json.dumps(d, default=_jsonable)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        d = json.loads(text)
        d["mesh_axes"], d["mesh_shape"] = tuple(d["mesh_axes"]), tuple(d["mesh_shape"])
        d["placements"] = {k: from_json(v) for k, v in d["placements"].items()}
        d["activations"] = {k: from_json(v) for k, v in d["activations"].items()}
        d["shapes"] = {k: tuple(v) for k, v in d["shapes"].items()}
        d["node_costs"] = [tuple(r) for r in d["node_costs"]]
        d["decisions"] = [Decision(x["name"], from_json(x["chosen"]),
                                   None if x["runner_up"] is None else from_json(x["runner_up"]),
                                   x["saving"], x["compute"], x["comm"]) for x in d["decisions"]]
        return cls(**d)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    return str(obj)
