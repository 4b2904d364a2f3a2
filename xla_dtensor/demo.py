"""The README's demo: ``python -m xla_dtensor.demo`` (``python3 dev.py demo``).

Shards a GPT-2 model automatically over the 8 virtual CPU devices
(``distribute_module(model, mesh, partition_fn="AUTO")``), prints the mesh, the
explained plan and a few parameters' layouts, trains a few steps with a progress bar,
and compares AUTO with the manual strategies (modelled, and measured against data
parallel). Then, briefly: link costs of a multi-slice HybridMesh, one layout written
four ways. ``--quick`` uses a tiny model and skips the measured comparison (the test).
"""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # XLA's C++ warnings (partitioner notes) off the screen
import mesh as _mesh  # noqa: F401  (virtual CPU devices before JAX starts)

import argparse
import statistics
import time
from dataclasses import dataclass

import jax
import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

import xla_dtensor
import xla_dtensor.spmd as xs
from autoshard.models import GPT2, GPT2Config
from mesh import HybridMesh, Mesh, topology_for
from xla_dtensor.sharding import ShardingSpec

MiB = 1 << 20


@dataclass(frozen=True)
class DemoSize:
    cfg: GPT2Config
    batch: int
    seq: int
    steps: int


SIZES = {
    "quick": DemoSize(GPT2Config(vocab=128, n_positions=32, n_embd=64, n_layer=1, n_head=4), 8, 32, 3),
    "full": DemoSize(GPT2Config(vocab=512, n_positions=64, n_embd=128, n_layer=2, n_head=4), 16, 64, 8),
}


def _section(console: Console, title: str) -> None:
    console.rule(f"[bold]{title}")


def demo_batch(size: DemoSize) -> tuple[torch.Tensor, torch.Tensor]:
    """The (fixed) token ids and next-token targets every demo step trains on."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, size.cfg.vocab, (size.batch, size.seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def demo_model(size: DemoSize) -> GPT2:
    """The demo's CPU GPT-2, seeded, with GPT-2's embedding init (std 0.02)."""
    torch.manual_seed(0)
    model = GPT2(size.cfg)
    with torch.no_grad():
        model.wte.weight.normal_(0.0, 0.02)
        model.wpe.weight.normal_(0.0, 0.02)
    return model


def _train(console: Console, model: torch.nn.Module, size: DemoSize, title: str,
           shard_batch=None) -> tuple[list[float], list[float]]:
    """``size.steps`` AdamW steps with a progress bar; returns (losses, step seconds)."""
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses, times = [], []
    columns = (TextColumn(f"[bold]{title}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}  step {task.fields[ms]}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(title, total=size.steps, loss="-", ms="-")
        for step in range(size.steps):
            t0 = time.perf_counter()
            ids, tgt = (t.to(xla_dtensor.device()) for t in demo_batch(size))
            if shard_batch is not None:
                ids, tgt = shard_batch(ids), shard_batch(tgt)
            loss = model(ids, tgt)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            xla_dtensor.sync()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
            bar.update(task, advance=1, loss=f"{losses[-1]:.3f}", ms=f"{times[-1] * 1e3:.0f} ms")
    console.print(f"{title} losses: " + " ".join(f"{x:.5f}" for x in losses))
    return losses, times


def show_auto(console: Console, size: DemoSize, m: Mesh) -> tuple[torch.nn.Module, list[float]]:
    _section(console, "GPT-2, sharded automatically")
    console.print(f"{len(jax.devices())} JAX devices on platform {jax.devices()[0].platform!r}; mesh: {m}")
    console.print(f"model: {size.cfg}; batch {size.batch} x {size.seq} tokens")
    console.print('model = xla_dtensor.distribute_module(GPT2(cfg), mesh, partition_fn="AUTO")  '
                  "# plan made at the first step's sync", markup=False)
    model = xs.distribute_module(demo_model(size), m, partition_fn="AUTO")
    losses, times = _train(console, model, size, "AUTO")
    plan = xs.last_plan()
    console.print(plan.explain(limit=8), soft_wrap=True, markup=False, highlight=False)
    _section(console, "A few parameters' layouts (xla_dtensor.visualize_tensor_sharding)")
    params = dict(model.named_parameters())
    for name in ("wte.weight", "h.0.attn.q_proj.weight", "h.0.mlp.c_proj.weight"):
        console.print(f"[bold]{name}[/bold] {tuple(params[name].shape)}")
        xla_dtensor.visualize_tensor_sharding(params[name], console=console, width=40)
    return model, times


def show_comparison(console: Console, size: DemoSize, m: Mesh, auto_times: list[float], measure: bool) -> None:
    _section(console, "AUTO vs manual strategies")
    plan = xs.last_plan()
    table = Table("strategy", "modelled step (cost model)", "vs AUTO", "modelled peak memory / device",
                  "measured step here")
    warm = max(1, len(auto_times) // 2)
    auto_ms = statistics.median(auto_times[warm:]) * 1e3
    dp_ms = None
    if measure:
        dp = xs.distribute_module(demo_model(size), m)  # parameters replicated
        batch_spec = (tuple(m.jax_axis_names), None)
        _, dp_times = _train(console, dp, size, "data parallel",
                             shard_batch=lambda t: xs.mark_sharding(t, m, batch_spec))
        dp_ms = statistics.median(dp_times[warm:]) * 1e3
    table.add_row("AUTO", f"{plan.objective * 1e3:.3f} ms", "1.00x", f"{plan.memory['peak'] / MiB:.2f} MiB",
                  f"{auto_ms:.0f} ms" if measure else "-")
    for name, b in sorted(plan.baselines.items(), key=lambda kv: kv[1]["cost"]):
        here = f"{dp_ms:.0f} ms" if (name == "data_parallel" and dp_ms is not None) else "-"
        table.add_row(name, f"{b['cost'] * 1e3:.3f} ms", f"{b['cost'] / plan.objective:.2f}x",
                      f"{b['peak_memory'] / MiB:.2f} MiB", here)
    console.print(table)
    from autoshard.guard import verdict

    quality = verdict(plan.stats.get("guard") or {})
    if quality:
        forced = ", ".join(r["node"] for r in (plan.stats["guard"].get("forced_by") or [])[:3])
        console.print(f"[yellow]Plan quality: {quality}" + (f"; forced by {forced}" if forced else "")
                      + " (plan.explain() has the table).")
    if dp_ms is not None and auto_ms > 1.1 * dp_ms:
        console.print(f"[yellow]Measured here, AUTO is {auto_ms / dp_ms:.1f}x slower than data parallel: the "
                      f"{plan.topology!r} preset's link model is far cheaper than collectives between virtual "
                      "devices on a few shared cores (and the lazy step's tracing is not modelled). The modelled "
                      "figures are for that preset, not for this host.")
    console.print(f"modelled on the {plan.topology!r} preset the plan was solved for; measured = median lazy step "
                  "(trace + run) after warm-up on 8 virtual CPU devices sharing this host's cores. "
                  "Full comparison: benchmarks/auto_vs_manual.py")


def show_topology(console: Console) -> None:
    _section(console, "What a 64 MiB all-reduce costs on a 2-slice HybridMesh (alpha-beta model)")
    hybrid = HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1),
                        axis_names=("data", "fsdp", "tensor"), num_granules=2)
    table = Table("system", *(f"{name} ({kind})" for name, kind in hybrid.axis_kinds().items()
                              if hybrid.axis_size(name) > 1))
    for preset in ("tpu-v5e", "tpu-v5p", "h100"):
        topo = topology_for(hybrid, preset)
        table.add_row(preset, *(f"{topo.all_reduce(64 * MiB, name) * 1e3:.3f} ms"
                                for name in hybrid.shape() if hybrid.axis_size(name) > 1))
    console.print(table)


def show_specs(console: Console) -> None:
    _section(console, "One layout, four spellings")
    m = Mesh(range(8), (2, 4), ("data", "model"))
    table = Table("partition spec", "DTensor placements", "jax PartitionSpec", "HLO sharding")
    for pspec in [("data", "model"), (None, "model"), (("data", "model"), None)]:
        spec = ShardingSpec.from_partition_spec(m, pspec)
        table.add_row(str(pspec), str(spec.to_placements()), str(spec.to_jax_pspec()), str(spec.to_hlo()))
    console.print(table)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m xla_dtensor.demo", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, no measured comparison (for tests)")
    args = ap.parse_args(argv)
    console = Console()
    size = SIZES["quick" if args.quick else "full"]
    m = Mesh(range(8), (2, 4), ("data", "model"))
    t0 = time.perf_counter()
    _, auto_times = show_auto(console, size, m)
    show_comparison(console, size, m, auto_times, measure=not args.quick)
    show_topology(console)
    show_specs(console)
    console.print(f"demo finished in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
