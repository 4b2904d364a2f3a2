"""torch_xla-style annotations: mark_sharding on data and on intermediates, then look at them."""
import torch

import xla_dtensor
import xla_dtensor.spmd as xs

mesh = xs.Mesh(range(8), (4, 2), ("data", "model"))
t = torch.randn(16, 8).to(xla_dtensor.device())
xs.mark_sharding(t, mesh, ("data", "model"))           # device data: resharded now
y = torch.tanh(t) @ torch.randn(8, 4).to(xla_dtensor.device())
xs.mark_sharding(y, mesh, ("data", None))                # pending value: a sharding constraint
z = y * 2                                                # nobody annotates z
xla_dtensor.sync()
print("t:", xs.get_hlo_sharding(t), " y:", xs.get_hlo_sharding(y), " z (propagated):", xs.get_hlo_sharding(z))
xs.visualize_tensor_sharding(z, width=40)
assert xs.get_hlo_sharding(y) == "{devices=[4,1,2]<=[8] last_tile_dim_replicate}"
print("ok")
