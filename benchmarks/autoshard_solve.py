"""Benchmark: autoshard on GPT-2 training steps of several sizes and meshes.

For each model (layers x d_model) and mesh it prints graph size before and after
simplification, trace / build / solve time, solver status and gap, and the modelled
step time of the plan against every manual baseline (same cost model). Writes a
markdown table and a PNG plot into ``benchmarks/results/``.

    PYTHONPATH=. python benchmarks/autoshard_solve.py [--quick]
"""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import argparse
import time
import warnings
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.api import solve
from autoshard.fx_builder import trace_training_step
from benchmarks.models import GPT2, GPT2Config

RESULTS = Path(__file__).parent / "results"
MODELS = [(12, 768, 12), (24, 1024, 16), (48, 1600, 25)]
MESHES = ["1x8", "2x4", "4x2", "dcn2x4"]


def make_mesh(name: str):
    if name.startswith("dcn"):
        return mesh.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "model"),
                               num_granules=2)
    shape = tuple(int(x) for x in name.split("x"))
    return mesh.Mesh(range(8), shape, ("data", "model"))


def trace_gpt2(layers: int, d: int, heads: int) -> tuple[object, float]:
    """The GPT-2 training-step graph (batch 8 x 1024, vocab 50304) and seconds to trace it."""
    cfg = GPT2Config(vocab=50304, n_positions=1024, n_embd=d, n_layer=layers, n_head=heads)
    t0 = time.perf_counter()
    with FakeTensorMode():
        model = GPT2(cfg)
        batch = torch.zeros(8, 1024, dtype=torch.long)
    graph = trace_training_step(model, (batch, batch), name=f"gpt2-{layers}x{d}")
    return graph, time.perf_counter() - t0


def run(models, meshes, topology: str, time_limit: float) -> list[dict]:
    rows = []
    for layers, d, heads in models:
        graph, trace_s = trace_gpt2(layers, d, heads)
        for mname in meshes:
            m = make_mesh(mname)
            t1 = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                plan = solve(graph, m, topology, time_limit=time_limit, cache=False)
            total = time.perf_counter() - t1
            best = plan.best_baseline()
            row = dict(model=f"{layers}L d{d}", mesh=mname, nodes=graph.num_nodes,
                       problem_nodes=plan.stats["problem_nodes"], merged=plan.stats["merged_groups"],
                       tied=plan.stats["decision_groups"], edges=plan.stats["folded_edges"],
                       trace_s=trace_s, build_s=total - plan.solve_time, solve_s=plan.solve_time,
                       status=plan.status, gap=plan.gap, phase=plan.stats.get("phase"), auto_ms=plan.objective * 1e3,
                       best=best[0], best_ms=best[1] * 1e3, ratio=best[1] / plan.objective,
                       warnings=len(caught), **{f"{k}_ms": v["cost"] * 1e3 for k, v in plan.baselines.items()})
            rows.append(row)
            print(" | ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()), flush=True)
    return rows


def table(rows: list[dict]) -> str:
    base = ["data_parallel", "fsdp", "megatron_tp", "2d", "dcn_dp_ici_tp", "dcn_dp_ici_fsdp"]
    head = ["model", "mesh", "aten nodes", "problem nodes", "merged", "tied", "trace s", "build s", "solve s",
            "status", "gap", "auto ms"] + [f"{b} ms" for b in base] + ["best baseline / auto"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["mesh"], r["nodes"], r["problem_nodes"], r["merged"], r["tied"], f"{r['trace_s']:.1f}",
                 f"{r['build_s']:.1f}", f"{r['solve_s']:.1f}", r["status"], f"{r['gap']:.2%}", f"{r['auto_ms']:.2f}"]
        cells += [f"{r[b + '_ms']:.2f}" if b + "_ms" in r else "-" for b in base]
        cells.append(f"{r['ratio']:.2f}x ({r['best']})")
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.5))
    labels = [f"{r['model']}\n{r['mesh']}" for r in rows]
    x = range(len(rows))
    ax1.bar([i - 0.2 for i in x], [r["auto_ms"] for r in rows], 0.4, label="autoshard")
    ax1.bar([i + 0.2 for i in x], [r["best_ms"] for r in rows], 0.4, label="best manual baseline")
    ax1.set_xticks(list(x), labels, fontsize=6)
    ax1.set_ylabel("modelled step time (ms)")
    ax1.legend()
    ax2.bar(list(x), [r["build_s"] + r["solve_s"] for r in rows], label="build + solve")
    ax2.bar(list(x), [r["solve_s"] for r in rows], label="solve")
    ax2.set_xticks(list(x), labels, fontsize=6)
    ax2.set_ylabel("seconds")
    ax2.legend()
    fig.suptitle("autoshard on GPT-2 training steps (tpu-v5e model)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="12 layers only")
    ap.add_argument("--topology", default="tpu-v5e")
    ap.add_argument("--time-limit", type=float, default=120.0)
    args = ap.parse_args()
    models = MODELS[:1] if args.quick else MODELS
    rows = run(models, MESHES, args.topology, args.time_limit)
    text = table(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "autoshard_solve.md").write_text(text + "\n")
    plot(rows, RESULTS / "autoshard_solve.png")


if __name__ == "__main__":
    main()
