"""torch's DTensor API on an 'xla' mesh routes to xla_dtensor; XLAShardedTensor vs CPU and JAX."""
from __future__ import annotations

import importlib.util
import sys

import jax
import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor.sharding import PlacementError, RankError


def test_hook_registers_only_the_leaf_module():
    assert importlib.util.find_spec("torch_xla") is None
    assert "torch_xla" not in sys.modules and "torch_xla.distributed" not in sys.modules
    assert sys.modules["torch_xla.distributed.spmd"].xla_distribute_tensor is not None


def test_seed_snippet_shards_equal_chunks_and_ops_match_cpu():
    world_size = jax.device_count()
    mesh = DeviceMesh("xla", list(range(world_size)))
    big = torch.randn(100000, 88)
    d = distribute_tensor(big, mesh, [Shard(0)])
    assert isinstance(d, xs.XLAShardedTensor) and d.shape == big.shape
    assert d.placements == (Shard(0),)
    shards = d.local_shards
    assert [s.device_id for s in shards] == list(range(world_size))
    for s, chunk in zip(shards, big.chunk(world_size)):
        assert torch.equal(s.data, chunk) and s.replica_id == 0
    # each device holds only its rows (the jax.Array is 8-way sharded)
    arr = d._storage.value.data
    assert {tuple(s.data.shape) for s in arr.addressable_shards} == {(100000 // world_size, 88)}
    w = torch.randn(88, 5)
    got = (torch.tanh(d) @ w.to(xla_dtensor.device())).sum(0)
    torch.testing.assert_close(got.cpu(), (torch.tanh(big) @ w).sum(0), rtol=1e-4, atol=1e-3)


def test_importerror_inside_our_code_surfaces_as_itself(monkeypatch):
    import xla_dtensor.spmd.api as api

    def broken(*a, **k):
        raise ImportError("no module named 'some_dependency'")
    monkeypatch.setattr(api, "distribute_tensor", broken)
    with pytest.raises(xs.DependencyImportError, match="some_dependency") as e:
        distribute_tensor(torch.ones(8), DeviceMesh("xla", list(range(8))), [Shard(0)])
    assert "install the torch_xla" not in str(e.value)


def test_our_entry_points_and_init_device_mesh():
    dm = xla_dtensor.init_device_mesh("xla", (4, 2), mesh_dim_names=("dp", "tp"))
    assert dm.mesh.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    t = torch.arange(48.).reshape(8, 6)
    d = xla_dtensor.distribute_tensor(t, dm, [Shard(0), Shard(1)])
    assert d.partition_spec == ("dp", "tp")
    want = jax.sharding.NamedSharding(xs.Mesh(range(8), (4, 2), ("dp", "tp")).jax_mesh(),
                                      jax.sharding.PartitionSpec("dp", "tp"))
    assert d.sharding_spec == str(want._to_xla_hlo_sharding(2))
    assert torch.equal(d.full_tensor().cpu(), t)
    assert torch.equal(d.local_shards[0].data, t[:2, :3])
    # single controller: to_local() is the global value as a plain lazy tensor (from_local's inverse)
    local = d.to_local()
    assert type(local) is xla_dtensor.LazyTensor and torch.equal(local.cpu(), t)


def test_partial_is_carried_and_redistribute_keeps_value():
    mesh = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("a", "b"))
    t = torch.randn(8, 4)
    d = distribute_tensor(t, mesh, [Partial(), Shard(1)])
    assert d.placements == (Partial(), Shard(1))   # as torch: t is the (reduced) global value
    assert torch.equal(d.cpu(), t)
    r = d.redistribute(mesh, [Shard(0), Partial()])
    assert r.placements == (Shard(0), Partial()) and torch.equal(r.cpu(), t)
    r2 = r.redistribute(mesh, [Replicate(), Replicate()])
    assert r2.placements == (Replicate(), Replicate()) and r2.sharding_spec == "{replicated}"
    assert torch.equal((r2 * 2).cpu(), t * 2)


def test_redistribute_is_differentiable():
    mesh = DeviceMesh("xla", list(range(8)))
    x = torch.randn(8, 3)
    d = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
    (d.redistribute(mesh, [Replicate()]) ** 2).sum().backward()
    torch.testing.assert_close(d.grad.cpu(), 2 * x)


@pytest.mark.parametrize("placements,err,text", [
    ([Shard(0), Shard(1)], RankError, "2 placements"),
    ([Shard(2)], PlacementError, "shards dim 2"),
])
def test_bad_placements(placements, err, text):
    with pytest.raises(err, match=text):
        distribute_tensor(torch.ones(4, 4), DeviceMesh("xla", list(range(8))), placements)


def test_mesh_with_unknown_devices_and_reshard_to_other_devices():
    with pytest.raises(xs.MeshDevicesError, match=r"\[8, 9\]"):
        distribute_tensor(torch.ones(8), DeviceMesh("xla", list(range(10))), [Shard(0)])
    d = distribute_tensor(torch.ones(8), DeviceMesh("xla", list(range(4))), [Shard(0)])
    with pytest.raises(xs.MeshDevicesError, match=r"\[0, 1, 2, 3\].*\[4, 5, 6, 7\]"):
        d.redistribute(DeviceMesh("xla", [4, 5, 6, 7]), [Shard(0)])
    # same devices, another order: allowed
    r = d.redistribute(DeviceMesh("xla", [3, 2, 1, 0]), [Shard(0)])
    assert torch.equal(r.cpu(), torch.ones(8))


def test_repr_never_fails(monkeypatch):
    d = distribute_tensor(torch.arange(4.), DeviceMesh("xla", list(range(4))), [Shard(0)])
    assert "{devices=[4]<=[4]}" in repr(d) and "3." in repr(d)
    import xla_dtensor.core.executor as ex

    def boom(*a, **k):
        raise RuntimeError("device lost")
    monkeypatch.setattr(ex, "to_cpu", boom)
    text = repr(d * 2)
    assert "values unavailable" in text and "device lost" in text
