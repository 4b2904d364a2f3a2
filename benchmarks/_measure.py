"""Run a model's training step on the virtual devices under one layout and measure it.

Example:
    >>> from benchmarks._measure import layout_key  # doctest: +SKIP
"""
from __future__ import annotations

import gc
import math
import time
from typing import Any

import torch

import xla_dtensor
from autoshard.spec import Spec, partition_spec
from benchmarks._hlo_stats import KINDS, collective_stats, last_executable, median, memory_bytes, time_executable
from benchmarks._strategies import apply_specs, apply_state_specs
from xla_dtensor.sharding import ShardingSpec


def layout_key(case_name: str, mesh: Any, specs: dict[str, Spec], shapes: dict[str, tuple[int, ...]]) -> tuple:
    """Device-level identity of a layout: equal keys compile to the same program."""
    axes = mesh.jax_axis_names
    return (case_name,) + tuple(
        (name, str(ShardingSpec.from_partition_spec(mesh, partition_spec(specs[name], axes, len(shape))).to_hlo()))
        for name, shape in sorted(shapes.items()))


def _train_step(module: torch.nn.Module, batch: list, opt: torch.optim.Optimizer) -> torch.Tensor:
    loss = module(*batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    xla_dtensor.sync()
    xla_dtensor.wait()
    return loss


def measure(case: Any, mesh: Any, specs: dict[str, Spec] | None, steps: int, reps: int, seen: dict, label: str,
            policy: Any = None) -> dict:
    """Measured figures of ``case`` on ``mesh`` under ``specs`` (manual) or the AUTO ``policy``.

    With ``specs`` the parameters, optimizer state and inputs are annotated with
    ``mark_sharding``; an identical layout seen before (in ``seen``) is not run again and
    reports ``same_as`` its ``label`` (e.g. ``"2x4/fsdp"``). With ``policy`` (an
    :class:`xla_dtensor.spmd.AutoPolicy`) the model goes through
    ``distribute_module(model, mesh, partition_fn=policy)``: the plan is made at the first
    step's sync and applied by the library.
    """
    import xla_dtensor.spmd as xs

    torch.manual_seed(0)
    cpu_model = case.make()
    cpu_batch = case.batch(case.batch_size)
    key = None
    if specs is not None:
        shapes = {n: tuple(p.shape) for n, p in cpu_model.named_parameters()}
        shapes.update({f"input{i}": tuple(t.shape) for i, t in enumerate(cpu_batch)})
        key = layout_key(case.name, mesh, specs, shapes)
        if key in seen:
            return dict(seen[key], same_as=seen[key]["measured_as"])
    if "cpu_loss" not in seen:
        with torch.no_grad():
            seen["cpu_loss"] = float(cpu_model(*cpu_batch))
    dev = xla_dtensor.device()
    batch = [t.to(dev) for t in cpu_batch]
    if specs is None:
        module = xs.distribute_module(cpu_model, mesh, partition_fn=policy)
    else:
        module = cpu_model.to(dev)
        apply_specs(module, batch, specs, mesh)
    opt = torch.optim.AdamW(module.parameters(), lr=1e-3)
    t0 = time.perf_counter()
    first = float(_train_step(module, batch, opt).detach().cpu())   # optimizer state (and the AUTO plan)
    if specs is not None:
        apply_state_specs(opt, module, specs, mesh)
    _train_step(module, batch, opt)                                 # the steady-state program
    warm_s = time.perf_counter() - t0
    extra = {}
    if specs is None:
        plan = xs.last_plan()
        extra = dict(policy_modelled_ms=plan.objective * 1e3, policy_solve_s=plan.solve_time)
    lazy = []
    for _ in range(steps):
        t1 = time.perf_counter()
        loss = _train_step(module, batch, opt)
        lazy.append(time.perf_counter() - t1)
    compiled = last_executable()
    exec_times = time_executable(compiled, reps)
    stats = collective_stats(compiled.as_text())
    mem = memory_bytes(compiled)
    out = dict(exec_ms=median(exec_times) * 1e3, lazy_ms=median(lazy) * 1e3, warmup_s=warm_s,
               peak_mib=mem["peak"] / 2**20, arg_mib=mem["argument"] / 2**20, temp_mib=mem["temp"] / 2**20,
               loss0=first, loss_cpu=seen["cpu_loss"], loss_last=float(loss.detach().cpu()),
               loss_ok=math.isclose(first, seen["cpu_loss"], rel_tol=1e-3, abs_tol=1e-4),
               collective_mib=sum(s.nbytes for s in stats.values()) / 2**20,
               measured_as=label, same_as="", **extra)
    for kind in KINDS:
        out[f"{kind}_n"] = stats[kind].count
        out[f"{kind}_kib"] = stats[kind].nbytes / 1024
    seen.setdefault("executables", {})[label] = compiled  # re-timed interleaved by the caller
    del module, opt, batch, loss, compiled
    gc.collect()
    if key is not None:
        seen[key] = out
    return out
