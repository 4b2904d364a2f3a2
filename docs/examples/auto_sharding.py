"""AUTO sharding: torch's distribute_module(partition_fn="AUTO") on a 2x4 mesh plans GPT-2's layouts.

The plan is made at the first sync() of a training step (forward, backward, AdamW step),
cached on disk ($XLA_DTENSOR_CACHE_DIR/plans), and applied to the parameters and the
optimizer state; the losses equal the CPU run.
"""
import copy

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_module

import xla_dtensor
import xla_dtensor.spmd as xs
from autoshard.models import GPT2, GPT2Config

torch.manual_seed(0)
model = GPT2(GPT2Config(vocab=128, n_positions=16, n_embd=64, n_layer=2, n_head=4))
g = torch.Generator().manual_seed(1)
batches = [(torch.randint(0, 128, (8, 16), generator=g), torch.randint(0, 128, (8, 16), generator=g))
           for _ in range(3)]


def train(model, device=None):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for idx, tgt in batches:
        if device is not None:
            idx, tgt = idx.to(device), tgt.to(device)
        loss = model(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if device is not None:
            xla_dtensor.sync()          # step 1: IR -> autoshard plan -> annotations, then run
        losses.append(loss.item())
    return losses


ref = train(copy.deepcopy(model))
dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("data", "model"))
auto = copy.deepcopy(model)
# "AUTO" takes the defaults; an AutoPolicy carries options (topology preset, budget, time limit)
distribute_module(auto, dm, partition_fn=xs.AutoPolicy(topology="tpu-v5e", time_limit=30))
got = train(auto, xla_dtensor.device())

plan = auto._auto_plan
print(plan.explain(limit=8))
print("h.0.mlp.c_fc.weight:", auto.h[0].mlp.c_fc.weight.placements, "solver calls:", xs.auto_stats())
for a, b in zip(got, ref):
    print(f"loss AUTO {a:.6f} vs CPU {b:.6f}")
    assert abs(a - b) <= 1e-4 * abs(b)
print("ok")
