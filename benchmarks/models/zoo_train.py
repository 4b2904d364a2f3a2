"""Train a :mod:`benchmarks.models.zoo` model in one mode: the integration matrix's runner.

Modes (what a user writes, unchanged model code):

* ``cpu``: torch CPU eager, the oracle.
* ``single``: the model on the jax device, lazy (``sync()`` per step), one device.
* ``compile``: the same step under ``xla_dtensor.compile``.
* ``auto-1x8`` / ``auto-2x4``: ``distribute_module(model, mesh, partition_fn="AUTO")``.
* ``dp``: replicated parameters, the batch split 8 ways (a baseline of the benchmark).
* ``fsdp``: ``xla_dtensor.fsdp.shard_model`` on an 8-device ``fsdp`` axis.
* ``tp`` / ``tp-sp``: torch's ``parallelize_module`` with the model's Megatron plan
  (``tp-sp``: with ``SequenceParallel``) on the ``tp`` axis of a 2x4 ``(dp, tp)``
  ``DeviceMesh("xla", ...)``, the batch split on ``dp``; ``tp-own``: the library's own
  TP function (torchtitan's ``apply_tp``) on the same mesh.

Example:
    >>> from benchmarks.models.zoo import ZOO
    >>> r = train(ZOO["hf-gpt2"], "cpu", steps=2)
    >>> len(r.losses), r.compiles_after_warmup
    (2, 0)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from benchmarks.models.zoo import ZooModel

__all__ = ["MODES", "Result", "train", "unsupported"]

MODES = ("single", "compile", "auto-1x8", "auto-2x4", "fsdp", "tp", "tp-sp", "tp-own")
BENCH_MODES = ("single", "dp", "fsdp", "tp", "tp-sp", "tp-own", "auto-1x8", "auto-2x4")  # dp: benchmark baseline
WARMUP = 2  # steps that may compile: the first creates the optimizer state, the second is steady


@dataclass
class Result:
    """Losses per step, compiles after the warm-up steps, median steady step time (ms)."""

    losses: list[float]
    compiles_after_warmup: int = 0
    step_ms: float = float("nan")
    info: dict[str, Any] = field(default_factory=dict)


def unsupported(zm: ZooModel, mode: str) -> str | None:
    """Why ``mode`` does not apply to ``zm`` (``None``: it does)."""
    if mode not in MODES + ("cpu", "dp"):
        raise ValueError(f"unknown mode {mode!r}; modes: {('cpu', 'dp') + MODES}")
    if mode in ("tp", "tp-sp") and zm.tp_plan is None:
        if zm.own_tp is not None:
            return f"{zm.name}: its library's own Megatron plan (with sequence parallelism) is the tp-own column"
        return f"{zm.name} has no Megatron plan (no attention/MLP linears to split)"
    if mode == "tp-sp":
        try:
            zm.tp_plan(zm.build(), True)
        except ValueError as e:
            return str(e)
    if mode == "tp-own" and zm.own_tp is None:
        return f"{zm.name}'s library ships no TP function of its own"
    return None


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def train(zm: ZooModel, mode: str, steps: int = 4) -> Result:
    """Build ``zm`` fresh (seeded), apply ``mode``, run ``steps`` AdamW steps; see the module doc."""
    why = unsupported(zm, mode)
    if why is not None:
        raise ValueError(why)
    model = zm.build()
    if mode == "cpu":
        return _loop(zm, model, steps, put=lambda t: t, sync=None)
    import xla_dtensor
    from xla_dtensor import metrics

    dev = xla_dtensor.device()
    put, info = _apply(zm, model, mode, dev)
    step_fn = _compiled(zm) if mode == "compile" else None
    res = _loop(zm, model, steps, put=put, sync=xla_dtensor.sync, step_fn=step_fn, metrics=metrics)
    res.info.update(info)
    if mode.startswith("auto"):
        plan = getattr(model, "_auto_plan", None)
        if plan is not None:
            res.info["plan"] = _plan_summary(plan)
    return res


def _apply(zm: ZooModel, model: nn.Module, mode: str, dev: torch.device) -> tuple[Any, dict[str, Any]]:
    import xla_dtensor.spmd as xs
    from mesh import Mesh

    to_dev = lambda t: t.to(dev)  # noqa: E731
    if mode in ("single", "compile"):
        model.to(dev)
        return to_dev, {}
    if mode.startswith("auto"):
        shape = (1, 8) if mode == "auto-1x8" else (2, 4)
        xs.distribute_module(model, Mesh(range(8), shape, ("dp", "tp")), partition_fn="AUTO")
        return to_dev, {}
    if mode == "dp":
        mesh = Mesh(range(8), (8,), ("dp",))
        model.to(dev)
        return lambda t: xs.mark_sharding(t.to(dev), mesh, ("dp",) + (None,) * (t.dim() - 1)).global_tensor, {}
    if mode == "fsdp":
        from xla_dtensor.fsdp import shard_model
        shard_model(model, Mesh(range(8), (8,), ("fsdp",)))
        return to_dev, {}
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = xs.init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    tp_mesh = mesh["tp"]
    if mode == "tp-own":
        zm.own_tp(model, tp_mesh)
    else:
        parallelize_module(model, tp_mesh, zm.tp_plan(model, mode == "tp-sp"))
    model.to(dev)

    def put(t: torch.Tensor) -> torch.Tensor:
        return xs.mark_sharding(t.to(dev), mesh, ("dp",) + (None,) * (t.dim() - 1)).global_tensor
    return put, {}


def _compiled(zm: ZooModel) -> Any:
    import xla_dtensor

    def step(model: nn.Module, opt: torch.optim.Optimizer, *batch: torch.Tensor) -> torch.Tensor:
        loss = zm.loss(model, batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return xla_dtensor.compile(step)


def _loop(zm: ZooModel, model: nn.Module, steps: int, *, put: Any, sync: Any, step_fn: Any = None,
          metrics: Any = None) -> Result:
    opt = _adamw(model)
    losses, times, before = [], [], None
    for i in range(steps):
        if i == WARMUP and metrics is not None:
            before = metrics.snapshot()
        t0 = time.perf_counter()
        batch = tuple(put(t) for t in zm.batch(i))
        if step_fn is not None:
            loss = step_fn(model, opt, *batch)
        else:
            loss = zm.loss(model, batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            if sync is not None:
                sync()
        losses.append(float(loss.item()))
        times.append(time.perf_counter() - t0)
    res = Result(losses)
    if before is not None:
        res.compiles_after_warmup = metrics.diff(before)["compiles"]
    steady = sorted(times[WARMUP:])
    if steady:
        res.step_ms = 1e3 * steady[len(steady) // 2]
    return res


def _plan_summary(plan: Any) -> dict[str, Any]:
    """Counts of sharded parameters, whether the batch is split, and the plan-quality guard's findings."""
    from autoshard.guard import verdict

    params = [n for n in plan.placements if not n.startswith(("input:", "exp_avg", "exp_avg_sq", "step:"))
              and ":" not in n]
    sharded = [n for n in params if any(p != "R" for p in plan.placements[n])]
    inputs = {n: plan.placements[n] for n in plan.placements if n.startswith("input:")}
    guard = plan.stats.get("guard") or {}
    return {"params": len(params), "params_sharded": len(sharded),
            "batch_sharded": any(any(p != "R" for p in s) for s in inputs.values()),
            "objective": getattr(plan, "objective", None), "all_replicated": bool(guard.get("all_replicated")),
            "dp_feasible": bool(guard.get("dp_feasible")), "guard": verdict(guard) or "",
            "unknown_ops": list(plan.stats.get("unknown_ops") or [])}
