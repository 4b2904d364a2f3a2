"""Render a :class:`autoshard.plan.Plan` as text tables (rich): summary, quality guard, decisions, baselines."""
from __future__ import annotations

import io
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from autoshard.guard import verdict
from autoshard.spec import partition_spec, spec_str

if TYPE_CHECKING:  # pragma: no cover
    from autoshard.plan import Plan


def _t(seconds: float) -> str:
    return "inf" if seconds == float("inf") else f"{seconds * 1e3:.3f} ms"


def _b(nbytes: float) -> str:
    return f"{nbytes / 2**30:.3f} GiB" if nbytes >= 2**27 else f"{nbytes / 2**20:.2f} MiB"


def render(plan: Plan, limit: int = 40) -> str:
    """The plan's explanation as plain text."""
    out = io.StringIO()
    con = Console(file=out, width=130, force_terminal=False, color_system=None)
    mesh = " x ".join(f"{a}={n}" for a, n in zip(plan.mesh_axes, plan.mesh_shape))
    con.print(f"autoshard plan: mesh {mesh} on {plan.topology}; status {plan.status}, modelled step "
              f"{_t(plan.objective)} (bound {_t(plan.bound)}, gap {plan.gap:.2%}), solved in {plan.solve_time:.2f} s")
    mem = ", ".join(f"{k} {_b(v)}" for k, v in plan.memory.items())
    con.print(f"memory per device: {mem}")
    _guard(con, plan)
    _layers(con, plan)
    generic = plan.stats.get("generic_ops") or {}
    if generic:
        con.print("ops planned by the generic rule: " + ", ".join(f"{op} ({kind})" for op, kind in generic.items()))
    table = Table(title="parameters (placement per mesh axis; saving = runner-up's extra step time)")
    for col in ("parameter", "shape", "placement", "partition spec", "runner-up", "saving", "compute", "comm"):
        table.add_column(col)
    for d in sorted(plan.decisions, key=lambda d: -d.saving)[:limit]:
        table.add_row(d.name, str(plan.shapes.get(d.name, "")), spec_str(d.chosen),
                      str(partition_spec(d.chosen, plan.mesh_axes, len(plan.shapes.get(d.name, ())))),
                      "-" if d.runner_up is None else spec_str(d.runner_up), _t(d.saving),
                      _t(d.compute), _t(d.comm))
    if len(plan.decisions) > limit:
        table.caption = f"{len(plan.decisions) - limit} more parameters not shown"
    con.print(table)
    inputs = [k for k, r in plan.roles.items() if r == "input"]
    if inputs:
        con.print("inputs: " + ", ".join(f"{k} {spec_str(plan.placements[k])}" for k in inputs))
    base = Table(title="manual baselines (same cost model)")
    for col in ("plan", "modelled step", "vs autoshard", "peak memory", "fits budget"):
        base.add_column(col)
    base.add_row("autoshard", _t(plan.objective), "1.00x", _b(plan.memory.get("peak", 0.0)), "yes")
    for name, b in sorted(plan.baselines.items(), key=lambda kv: kv[1]["cost"]):
        ratio = b["cost"] / plan.objective if plan.objective > 0 else float("nan")
        base.add_row(name, _t(b["cost"]), f"{ratio:.2f}x", _b(b["peak_memory"]), "yes" if b["feasible"] else "no")
    con.print(base)
    return out.getvalue()


def _guard(con: Console, plan: Plan) -> None:
    """The plan-quality warning (:mod:`autoshard.guard`) and the ops that forced the plan."""
    guard = plan.stats.get("guard") or {}
    line = verdict(guard)
    if line is None:
        return
    con.print(f"PLAN QUALITY: {line}")
    rows = guard.get("forced_by") or []
    if not rows:
        return
    ref, extra = guard.get("reference", "?"), guard.get("ref_extra", 0.0)
    table = Table(title=f"where {ref} (modelled {_t(extra)} slower) pays more than this plan: the ops that forced it")
    for col in ("node", "op", "extra", "why"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["node"], r["op"], _t(r["extra_s"]), r["why"])
    con.print(table)


def _layers(con: Console, plan: Plan) -> None:
    """Which layers were clustered (solved once) and which the plan checkpoints (:mod:`autoshard.layered`)."""
    cl = plan.stats.get("clustering")
    if not cl:
        return
    a, b = cl["identical"]
    con.print(f"layer clustering: {cl['prefix']}.{a}..{b} of {cl['layers']} layers are identical; solved as layers "
              f"{', '.join(map(str, cl['kept']))} with {cl['prefix']}.{cl['kept'][1]} standing for {cl['weight']} "
              f"({cl['graph_nodes']} -> {cl['reduced_nodes']} graph nodes)")
    rm = plan.stats.get("remat") or {}
    if rm.get("count"):
        names = ", ".join(f"{cl['prefix']}.{k}" for k in rm["layers"])
        con.print(f"activation checkpointing: {rm['count']} layers ({names}); each frees "
                  f"{_b(rm['saved_bytes_per_layer'])} of saved activations and recomputes "
                  f"{_t(rm['recompute_s_per_layer'])} of forward")
    else:
        con.print("activation checkpointing: none (every layer keeps its activations)")
