"""2-D Megatron GPT-2: batch on 'data', column-parallel qkv/fc1, row-parallel proj/fc2 on 'model'."""
import copy

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import xla_dtensor
from autoshard.models import GPT2, GPT2Config

torch.manual_seed(0)
model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=1, n_head=4))
idx, tgt = torch.randint(0, 64, (4, 16)), torch.randint(0, 64, (4, 16))
ref = model(idx, tgt).item()

dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("data", "model"))
m = copy.deepcopy(model)
plan = {"attn.q_proj": ColwiseParallel(), "attn.k_proj": ColwiseParallel(), "attn.v_proj": ColwiseParallel(),
        "attn.c_proj": RowwiseParallel(), "mlp.c_fc": ColwiseParallel(), "mlp.c_proj": RowwiseParallel()}
for block in m.h:
    parallelize_module(block, dm["model"], plan)                # torch's own TP API, a sliced xla mesh
xla_dtensor.distribute_module(m, dm)                            # replicate the rest
idx_d = xla_dtensor.distribute_tensor(idx, dm, [Shard(0), Replicate()])
tgt_d = xla_dtensor.distribute_tensor(tgt, dm, [Shard(0), Replicate()])
loss = m(idx_d, tgt_d).item()
print(f"loss sharded {loss:.6f} vs CPU {ref:.6f}")
assert abs(loss - ref) <= 1e-4 * abs(ref)
print("ok")
