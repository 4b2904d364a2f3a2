"""Uneven sharding: padded inside, logical shape outside, results equal the unsharded computation."""
from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import xla_dtensor
import xla_dtensor.spmd as xs


@pytest.mark.parametrize("shape,mesh_shape,placements", [
    ((10, 3), (4,), [Shard(0)]),
    ((5, 7), (2, 4), [Shard(0), Shard(1)]),
    ((3, 6), (8,), [Shard(0)]),           # more devices than rows: empty shards
    ((6, 9), (2, 4), [Replicate(), Shard(1)]),
])
def test_shards_follow_torch_chunk_and_ops_match_cpu(shape, mesh_shape, placements):
    n = 1
    for s in mesh_shape:
        n *= s
    grid = torch.arange(n).reshape(mesh_shape).tolist()
    mesh = DeviceMesh("xla", grid)
    x = torch.randn(shape)
    d = distribute_tensor(x, mesh, placements)
    assert d.shape == x.shape and d.placements == tuple(placements)
    # every device's piece is torch.chunk's piece (DTensor's convention)
    for s in d.local_shards:
        coord = [i for i, row in enumerate(torch.tensor(grid).reshape(-1).tolist()) if row == s.device_id][0]
        coord = list(torch.unravel_index(torch.tensor(coord), mesh_shape))
        want = x
        for axis, p in enumerate(placements):
            if isinstance(p, Shard):
                chunks = want.chunk(mesh_shape[axis], p.dim)
                k = int(coord[axis])
                want = chunks[k] if k < len(chunks) else want.narrow(p.dim, 0, 0)
        assert torch.equal(s.data, want), (s.device_id, s.indices)
    w = torch.randn(shape[1], 4)
    dw = w.to(xla_dtensor.device())
    torch.testing.assert_close((torch.relu(d) @ dw).cpu(), torch.relu(x) @ w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d.sum(0).cpu(), x.sum(0), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(d.full_tensor().cpu(), x)


def test_uneven_parameter_keeps_layout_through_training_steps(dev):
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 10)   # weight (10, 6): 10 rows on 4 devices
    ref = torch.nn.Linear(6, 10)
    ref.load_state_dict(lin.state_dict())
    mesh = xs.Mesh(range(4), (4,), ("x",))
    lin.to(dev)
    xs.mark_sharding(lin.weight, mesh, ("x", None))
    xs.mark_sharding(lin.bias, mesh, ("x",))
    opt = torch.optim.SGD(lin.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(3)
    for _ in range(3):
        x = torch.randn(5, 6, generator=g)
        for m, o, inp in ((lin, opt, x.to(dev)), (ref, ref_opt, x)):
            m(inp).pow(2).mean().backward()
            o.step()
            o.zero_grad()
        xla_dtensor.sync()
    torch.testing.assert_close(lin.weight.cpu(), ref.weight.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lin.bias.cpu(), ref.bias.detach(), rtol=1e-5, atol=1e-6)
    # after sync the data is stored padded to 12 rows, evenly split, logical shape outside
    from xla_dtensor.core.layout import padded_source
    src = padded_source(lin.weight._storage.value)
    assert src is not None and src.data.shape == (12, 6)
    assert {s.data.shape for s in src.data.addressable_shards} == {(3, 6)}
    assert lin.weight.shape == (10, 6)
    assert xs.XLAShardedTensor.wrap(lin.weight.detach()).placements == (Shard(0),)


def test_mark_sharding_uneven_on_device_data_and_pending(dev):
    mesh = xs.Mesh(range(8), (4, 2), ("x", "y"))
    x = torch.randn(7, 3)
    t = x.to(dev)
    xs.mark_sharding(t, mesh, ("x", "y"))
    assert [tuple(s.data.shape) for s in xs.XLAShardedTensor.wrap(t).local_shards][:2] == [(2, 2), (2, 1)]
    p = torch.cos(t) + 1
    xs.mark_sharding(p, mesh, (None, ("x", "y")))  # 3 columns over 8 devices
    torch.testing.assert_close(p.cpu(), torch.cos(x) + 1)
    torch.testing.assert_close(t.cpu(), x)
