"""Uneven sharding: 10 rows on 4 devices. Stored padded to 12, seen as 10 everywhere."""
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

import xla_dtensor

x = torch.randn(10, 3)
d = xla_dtensor.distribute_tensor(x, DeviceMesh("xla", [0, 1, 2, 3]), [Shard(0)])
print(tuple(d.shape), [(s.device_id, s.indices[0]) for s in d.local_shards])
assert [tuple(s.data.shape) for s in d.local_shards] == [(3, 3), (3, 3), (3, 3), (1, 3)]
torch.testing.assert_close((d.exp() @ d.T).cpu(), x.exp() @ x.T)
print("ok")
