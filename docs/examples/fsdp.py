"""FSDP through SPMD: parameters split on their largest divisible dim, batch split on dim 0."""
import copy

import torch

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor.fsdp import shard_model

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
x, y = torch.randn(8, 16), torch.randn(8, 4)
ref = torch.nn.functional.mse_loss(model(x), y).item()
m = shard_model(copy.deepcopy(model), xs.Mesh(range(8), (8,), ("fsdp",)))
print({n: xs.get_spec(p).to_partition_spec() for n, p in m.named_parameters()})
loss = torch.nn.functional.mse_loss(m(x.to(xla_dtensor.device())), y.to(xla_dtensor.device())).item()
assert abs(loss - ref) <= 1e-5 * abs(ref), (loss, ref)
print("ok")
