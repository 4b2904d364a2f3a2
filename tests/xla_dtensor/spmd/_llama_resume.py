"""A realistic HF Llama training loop, run as a script: ``python _llama_resume.py MODE PHASE PATH``.

Tiny ``LlamaForCausalLM`` (random weights), AdamW with weight decay, warmup + cosine
(``LambdaLR``), gradient clipping, 2-step accumulation, activation checkpointing. MODE:
``cpu`` (plain torch), ``fsdp`` (``shard_model`` on 8 devices) or ``tp`` (Megatron plan on
2x4). PHASE ``straight`` trains 13 steps; ``train`` trains 10 and ``dcp.save``-s model,
optimizer and schedule to PATH; ``resume`` (a new process) restores PATH, counting the
XLA compiles of the restore, then trains steps 10-12. Prints one ``RESULT {json}`` line.
"""
from __future__ import annotations

import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))

import torch  # noqa: E402

from benchmarks.models import torchvision_shim  # noqa: E402

V, B, T, ACC, WARMUP, TOTAL = 64, 8, 16, 2, 3, 20


def _lr_factor(step: int) -> float:
    if step < WARMUP:
        return (step + 1) / WARMUP
    return 0.5 * (1 + math.cos(math.pi * (step - WARMUP) / (TOTAL - WARMUP)))


def build(mode: str):
    torchvision_shim.install()
    import transformers as tr

    import xla_dtensor
    torch.manual_seed(0)
    m = tr.LlamaForCausalLM(tr.LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=T,
                                          use_cache=False))
    m.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    m.train()
    put = lambda t: t  # noqa: E731
    if mode == "fsdp":
        from mesh import Mesh
        from xla_dtensor.fsdp import shard_model
        m = shard_model(m, Mesh(range(8), (8,), ("fsdp",)))
        put = lambda t: t.to(xla_dtensor.device())  # noqa: E731
    elif mode == "tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor

        from xla_dtensor.spmd.plans import megatron_plan
        dm = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
        torch.distributed.tensor.parallel.parallelize_module(m, dm["tp"], megatron_plan(m))
        xla_dtensor.distribute_module(m, dm)
        put = lambda t: distribute_tensor(t, dm, [Shard(0), Replicate()])  # noqa: E731
    opt = torch.optim.AdamW(m.parameters(), lr=3e-2, weight_decay=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_factor)
    return m, opt, sched, put


def train(mode: str, m, opt, sched, put, steps) -> list[float]:
    import xla_dtensor
    losses = []
    for s in steps:
        g = torch.Generator().manual_seed(100 + s)
        total = 0.0
        for _ in range(ACC):
            ids = put(torch.randint(0, V, (B, T), generator=g))
            loss = m(input_ids=ids, labels=ids).loss / ACC
            loss.backward()
            total = total + loss.detach()
        torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if mode != "cpu":
            xla_dtensor.sync()
        losses.append(float(total.item()))
    return losses


def main(mode: str, phase: str, path: str) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import xla_dtensor
    from xla_dtensor import metrics
    m, opt, sched, put = build(mode)
    if phase == "straight":
        return {"losses": train(mode, m, opt, sched, put, range(13))}
    if phase == "train":
        losses = train(mode, m, opt, sched, put, range(10))
        msd, osd = get_state_dict(m, opt)
        dcp.save({"model": msd, "optim": osd, "sched": sched.state_dict()}, checkpoint_id=path)
        return {"losses": losses}
    xla_dtensor.sync()
    before, t0 = metrics.snapshot(), time.perf_counter()
    msd, osd = get_state_dict(m, opt)
    sd = {"model": msd, "optim": osd, "sched": sched.state_dict()}
    dcp.load(sd, checkpoint_id=path)
    set_state_dict(m, opt, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    sched.load_state_dict(sd["sched"])
    xla_dtensor.sync()
    d = metrics.diff(before)
    tensors = len(msd) + sum(len(v) for v in osd["state"].values())
    restore = {"compiles": d["compiles"], "persistent_cache_hits": d.get("persistent_cache_hits", 0),
               "tensors": tensors, "seconds": round(time.perf_counter() - t0, 2)}
    return {"restore": restore, "losses": train(mode, m, opt, sched, put, range(10, 13))}


if __name__ == "__main__":
    print("RESULT " + json.dumps(main(*sys.argv[1:4])), flush=True)
