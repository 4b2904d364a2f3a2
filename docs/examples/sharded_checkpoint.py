"""Save a sharded model shard by shard and load it into another layout."""
import tempfile

import torch
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
from xla_dtensor import checkpoint

mesh = xla_dtensor.Mesh(range(8), (2, 4), ("dp", "tp"))
w = torch.randn(12, 8)
state = {"w": xla_dtensor.distribute_tensor(w, mesh, [Replicate(), Shard(0)]), "step": 3}
path = tempfile.mkdtemp()
checkpoint.save(state, path)
target = {"w": xla_dtensor.distribute_tensor(torch.zeros(12, 8), mesh, [Shard(1), Replicate()]), "step": 0}
checkpoint.load(target, path)
assert torch.equal(target["w"].cpu(), w) and target["step"] == 3
print("ok:", path)
