"""torch's own DTensor API on an "xla" DeviceMesh runs on xla_dtensor (no torch_xla needed)."""
import torch

import xla_dtensor  # noqa: F401  (registers the hook)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

world_size = 8
mesh = DeviceMesh("xla", list(range(world_size)))
big = torch.randn(1000, 88)
d = distribute_tensor(big, mesh, [Shard(0)])
print(type(d).__name__, d.placements, d.sharding_spec)
assert all(torch.equal(s.data, c) for s, c in zip(d.local_shards, big.chunk(world_size)))
torch.testing.assert_close((d.relu() * 2).sum(0).cpu(), (big.relu() * 2).sum(0))
print("ok")
