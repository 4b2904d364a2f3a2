"""Benchmark: AUTO at real sizes, planned from meta models, against the manual layouts people use.

Llama-3-8B (32 layers, width 4096, GQA 32/8, vocab 128,256) on 8 H100s (mesh 8 and
2x4), Llama-3-70B (80 layers, width 8192, GQA 64/8) on 64 H100s (8 hosts x 8 GPUs: a
HybridMesh whose first axis crosses hosts over InfiniBand) and Mixtral-8x7B on 8 H100s,
all at sequence 4096 with bf16 parameters, gradients and AdamW moments, 80 GB per GPU.
Each model is built under ``torch.device("meta")`` from its transformers config and
traced on fake tensors (no memory), clustered (:mod:`autoshard.cluster`) and solved with
activation checkpointing as a decision (:mod:`autoshard.layered`). The manual layouts
(data parallel, FSDP, Megatron TP, DP x TP, FSDP x TP, and across hosts DP or HSDP with
TP/FSDP inside a host) are completed and scored by the same cost model, each with the
fewest checkpointed layers that make it fit. Prints progress, a table, and writes
``benchmarks/results/auto_at_scale.md`` and ``auto_at_scale.png``.

    .venv/bin/python benchmarks/auto_at_scale.py [--only llama3-8b] [--time-limit 60]
"""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import argparse
import sys
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from autoshard.layered import solve_layered  # noqa: E402
from autoshard.fx_builder import trace_training_step  # noqa: E402
from benchmarks._plots import paired_bars  # noqa: E402
from benchmarks.models.torchvision_shim import install  # noqa: E402

RESULTS = Path(__file__).parent / "results"
GB80 = 80e9
MANUAL_NAMES = {"data_parallel": "DP", "fsdp": "FSDP", "megatron_tp": "TP", "2d": "DP x TP", "fsdp_tp": "FSDP x TP",
                "dcn_dp_ici_tp": "DP(hosts) x TP(host)", "dcn_dp_ici_fsdp": "DP(hosts) x FSDP(host)"}


class CausalLMLoss(torch.nn.Module):
    """An HF causal LM whose forward returns its own loss."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids, labels=labels).loss


def _hf(name: str) -> torch.nn.Module:
    install()  # transformers imports torchvision, whose C++ ops do not load on CPU torch
    import transformers as tf

    if name == "llama3-8b":
        cfg = tf.LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                             rope_theta=500000.0)
        cls = tf.LlamaForCausalLM
    elif name == "llama3-70b":
        cfg = tf.LlamaConfig(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80,
                             num_attention_heads=64, num_key_value_heads=8, max_position_embeddings=8192,
                             rope_theta=500000.0)
        cls = tf.LlamaForCausalLM
    elif name == "mixtral-8x7b":
        cfg = tf.MixtralConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                               num_attention_heads=32, num_key_value_heads=8, num_local_experts=8,
                               num_experts_per_tok=2, max_position_embeddings=32768)
        cls = tf.MixtralForCausalLM
    else:
        raise ValueError(f"unknown model {name!r}")
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        return CausalLMLoss(cls(cfg).to(torch.bfloat16))


def _mesh(kind: str):
    if kind == "8":
        return mesh.Mesh(range(8), (8,), ("model",), validate=False)
    if kind == "2x4":
        return mesh.Mesh(range(8), (2, 4), ("data", "model"), validate=False)
    if kind == "8 hosts x 8":
        devices = [SimpleNamespace(id=i) for i in range(64)]
        return mesh.HybridMesh(ici_mesh_shape=(1, 8), dcn_mesh_shape=(8, 1), axis_names=("hosts", "gpus"),
                               devices=devices, num_granules=8, validate=False)
    raise ValueError(kind)


CASES = [("llama3-8b", "8", 8), ("llama3-8b", "2x4", 8), ("llama3-70b", "8 hosts x 8", 16),
         ("mixtral-8x7b", "2x4", 8)]
SEQ = 4096


def trace(name: str, batch: int) -> tuple[object, float]:
    t0 = time.perf_counter()
    model = _hf(name)
    ids = torch.zeros(batch, SEQ, dtype=torch.long, device="meta")
    graph = trace_training_step(model, (ids, ids), name=name)
    return graph, time.perf_counter() - t0


def run(cases: list, time_limit: float) -> list[dict]:
    from mesh import topology_for

    rows, graphs = [], {}
    for case in cases:
        try:
            rows.append(_case(*case, graphs, time_limit))
        except Exception as err:  # noqa: BLE001  NOTE: one model failing must not lose the others' rows
            print(f"[{case[0]} on {case[1]}] FAILED: {type(err).__name__}: {err}", flush=True)
    return rows


def _case(name: str, mesh_kind: str, batch: int, graphs: dict, time_limit: float) -> dict:
    from mesh import topology_for

    if True:
        if (name, batch) not in graphs:
            print(f"[{name}] tracing on meta/fake tensors (batch {batch} x {SEQ}) ...", flush=True)
            graphs[(name, batch)] = trace(name, batch)
            g, s = graphs[(name, batch)]
            print(f"[{name}] traced {g.num_nodes} nodes in {s:.1f} s", flush=True)
        graph, trace_s = graphs[(name, batch)]
        m = _mesh(mesh_kind)
        topo = topology_for(m, "h100")
        print(f"[{name} on {mesh_kind}] solving ...", flush=True)
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plan = solve_layered(graph, m, topo, GB80, time_limit,
                                 progress=lambda msg: print(f"[{name} on {mesh_kind}]   {msg}", flush=True))
        solve_s = time.perf_counter() - t0
        manual = {k: v for k, v in plan.baselines.items() if k != "replicated" and v["feasible"]}
        best = min(manual, key=lambda k: manual[k]["cost"]) if manual else None
        remat = plan.stats["remat"]
        row = dict(model=name, mesh=mesh_kind, batch=batch, auto_ms=plan.objective * 1e3,
                   best=MANUAL_NAMES.get(best, best), best_remat=manual[best]["remat"] if best else None,
                   best_ms=manual[best]["cost"] * 1e3 if best else float("nan"),
                   peak_gib=plan.memory["peak"] / 2**30, fits=plan.memory["peak"] <= GB80,
                   remat=remat["count"], remat_of=len(remat["candidates"]), remat_layers=remat["layers"],
                   trace_s=trace_s, solve_s=solve_s, nodes=graph.num_nodes,
                   reduced=plan.stats["clustering"]["reduced_nodes"], status=plan.status,
                   manual={MANUAL_NAMES.get(k, k): (v["cost"] * 1e3, v["feasible"], v["remat"])
                           for k, v in plan.baselines.items() if k != "replicated"})
        row["ratio"] = row["best_ms"] / row["auto_ms"]
        print(f"[{name} on {mesh_kind}] AUTO {row['auto_ms']:.1f} ms vs {row['best']} {row['best_ms']:.1f} ms, "
              f"peak {row['peak_gib']:.1f} GiB, remat {row['remat']}/{row['remat_of']}, "
              f"trace {trace_s:.1f} s + solve {solve_s:.1f} s", flush=True)
    return row


def table(rows: list[dict]) -> str:
    head = ["model", "mesh (H100s)", "batch x seq", "AUTO modelled ms", "best manual ms (which)", "ratio",
            "AUTO peak GiB/device", "fits 80 GB", "remat layers chosen", "trace s", "solve s", "trace + solve s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        remat = f"{r['remat']} of {r['remat_of']}" + (f" ({_ranges(r['remat_layers'])})" if r["remat"] else "")
        best = f"{r['best_ms']:.1f} ({r['best']}" + (f", remat {r['best_remat']}" if r["best_remat"] else "") + ")"
        cells = [r["model"], r["mesh"], f"{r['batch']} x {SEQ}", f"{r['auto_ms']:.1f}", best, f"{r['ratio']:.2f}x",
                 f"{r['peak_gib']:.1f}", "yes" if r["fits"] else "no", remat, f"{r['trace_s']:.1f}",
                 f"{r['solve_s']:.1f}", f"{r['trace_s'] + r['solve_s']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ranges(layers: list[int]) -> str:
    return "layers " + ", ".join(str(k) for k in layers) if len(layers) <= 6 else \
        f"layers {layers[0]}..{layers[-1]}, {len(layers)} spread evenly"


def manual_table(rows: list[dict]) -> str:
    lines = ["| model | mesh | manual layout | modelled ms | fits 80 GB | remat layers |", "|---|---|---|---|---|---|"]
    for r in rows:
        for k, (ms, ok, remat) in sorted(r["manual"].items(), key=lambda kv: kv[1][0]):
            lines.append(f"| {r['model']} | {r['mesh']} | {k} | {ms:.1f} | {'yes' if ok else 'no'} | {remat} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=None, help="run only this model (llama3-8b, llama3-70b, mixtral-8x7b)")
    ap.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    args = ap.parse_args()
    cases = [c for c in CASES if args.only in (None, c[0])]
    rows = run(cases, args.time_limit)
    text = table(rows)
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "auto_at_scale.md").write_text(
        "# AUTO at real sizes (`benchmarks/auto_at_scale.py`)\n\n" + text + "\n\nEvery manual layout "
        "(same cost model, the fewest checkpointed layers that fit):\n\n" + manual_table(rows) + "\n")
    labels = [f"{r['model']}\n{r['mesh']}" for r in rows]
    paired_bars(RESULTS / "auto_at_scale.png", labels, [r["auto_ms"] for r in rows], [r["best_ms"] for r in rows],
                ("AUTO", "best manual"), "modelled step (ms)", "AUTO vs manual layouts at real sizes (H100 model)")


if __name__ == "__main__":
    main()
