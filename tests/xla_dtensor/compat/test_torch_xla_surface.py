"""The torch_xla compat layer against torch_xla's documented behaviour (oracles: torch CPU, hand-derived HLO)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

import xla_dtensor
import xla_dtensor.compat.torch_xla as torch_xla
import xla_dtensor.compat.torch_xla.core.xla_model as xm
import xla_dtensor.compat.torch_xla.distributed.spmd as xs
import xla_dtensor.compat.torch_xla.runtime as xr
from xla_dtensor.compat.torch_xla.distributed.parallel_loader import MpDeviceLoader
from xla_dtensor.compat.torch_xla.experimental.distributed_checkpoint import CheckpointManager, SPMDSavePlanner
from xla_dtensor.compat.torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel


@pytest.fixture(scope="module")
def mesh():
    return xs.Mesh(np.arange(8), (2, 4), ("x", "y"))


def test_runtime_and_xla_model_counts():
    assert (xr.world_size(), xr.global_ordinal(), xr.local_ordinal()) == (1, 0, 0)
    assert xr.global_runtime_device_count() == xr.addressable_runtime_device_count() == 8
    assert xr.is_spmd() and xr.device_type() == "CPU"
    assert xm.get_xla_supported_devices() == ["xla:0"]  # one virtual device under SPMD, as torch_xla
    assert xm.xla_device() == torch_xla.device() == xla_dtensor.device()
    with pytest.raises(ValueError, match="devices 0..7"):
        xm.xla_device(9)
    t = torch.ones(3, device=xm.xla_device()) * 2
    xm.mark_step(); xm.wait_device_ops()
    assert t.tolist() == [2.0, 2.0, 2.0]


def test_mesh_errors_logical_mesh_and_op_sharding(mesh):
    assert mesh.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert mesh.get_axis_name_idx("y") == 1 and mesh.get_axis_name_idx("z") is None
    for bad in [lambda: xs.Mesh(range(8), (3, 3)), lambda: xs.Mesh([0, 0, 1, 2], (4,)),
                lambda: xs.Mesh(range(8), (8,), ("a", "b"))]:
        with pytest.raises(AssertionError):
            bad()
    assert str(mesh.get_op_sharding(("x", "y"))) == "{devices=[2,4]<=[8]}"
    assert str(mesh.get_op_sharding(("y", None))) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    assert str(mesh.get_op_sharding(())) == "{replicated}"
    hm = xs.HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model"))
    assert hm.dcn_mesh_shape == (1, 1) and hm.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_mark_sharding_semantics(mesh, dev):
    t = torch.randn(8, 32).to(dev)
    assert xs.get_sharding_spec(t) == ""
    st = xs.mark_sharding(t, mesh, ("x", None))
    assert st.sharding_spec == xs.get_sharding_spec(t) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"
    assert st.sharding_type == xs.ShardingType.PARTIAL
    xs.mark_sharding(t, mesh, ("x", None))  # the same layout again: fine
    with pytest.raises(RuntimeError, match="clear_sharding"):
        xs.mark_sharding(t, mesh, ("y", None))
    xs.mark_sharding(t, mesh, (None, ("x", "y")), overwrite=True)
    assert xs.get_sharding_spec(t) == "{devices=[1,8]<=[8]}"
    assert xs.get_sharding_spec(t * 2) == "{devices=[1,8]<=[8]}"  # a computed value: its propagated layout
    with pytest.raises(AssertionError, match="rank 2"):
        xs.mark_sharding(t, mesh, ("x",))
    with pytest.raises(ValueError, match="'z'"):
        xs.mark_sharding(t, mesh, ("z", None))
    assert xs.get_sharding_spec(xs.clear_sharding(t)) == ""
    d = xs.dynamo_mark_sharding(torch.zeros(8).to(dev), list(range(8)), [8], "('a',)", "('a',)")
    assert d.sharding_spec == "{devices=[8]<=[8]}"


def test_sharded_tensor_constructor_grad_and_padded_shards(mesh, dev):
    w = xs.XLAShardedTensor(torch.ones(4).to(dev))
    assert isinstance(w, xs.XLAShardedTensor) and tuple(w._spec.tensor_meta.shape) == (4,)
    g = torch.zeros(8, requires_grad=True).to(dev)
    s = xs.mark_sharding(g, mesh, (("x", "y"),))
    assert s.global_tensor is g and s.global_tensor.requires_grad
    u = xs.mark_sharding(torch.arange(7.).to(dev), mesh, (("x", "y"),))
    shards = u.local_shards
    assert [tuple(x.data.shape) for x in shards] == [(1,)] * 8
    assert [x.unpadded_data.tolist() for x in shards] == [[float(i)] for i in range(7)] + [[]]
    assert [x.shard_device for x in shards] == [f"xla:{i}" for i in range(8)]
    assert xs.wrap_if_sharded(g) is not g and xs.wrap_if_sharded(torch.ones(1).to(dev)).__class__ is not xs.XLAShardedTensor


def test_shard_as_barrier_and_manual(mesh, dev):
    a, b = torch.zeros(8, 8).to(dev), torch.ones(8, 8).to(dev)
    xs.mark_sharding(a, mesh, ("y", "x"))
    _, b2 = xs.shard_as(a, b)
    assert xs.get_sharding_spec(b2) == "{devices=[4,2]<=[2,4]T(1,0)}" and b2.sum().item() == 64
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 4)
    lin = torch.nn.Linear(4, 4)
    lin.load_state_dict(ref.state_dict())
    lin.to(dev)
    xs.apply_backward_optimization_barrier(lin)
    lin(torch.ones(2, 4).to(dev)).pow(2).sum().backward()
    ref(torch.ones(2, 4)).pow(2).sum().backward()
    assert "opt-barrier" in xla_dtensor.get_hlo([lin.weight.grad])
    assert torch.allclose(lin.weight.grad.cpu(), ref.weight.grad, atol=1e-5)
    with pytest.raises(NotImplementedError, match="shard_map"):
        xs.enable_manual_sharding(a, ("x", None))
    with pytest.raises(NotImplementedError):
        xs.disable_manual_sharding(a, ("x", None), (8, 8))


def test_mp_device_loader_places_and_prefetches(mesh, dev):
    spec = xs.ShardingSpec(mesh, (("x", "y"), None))
    data = [torch.full((16, 2), float(i)) for i in range(5)]
    out = list(MpDeviceLoader(data, dev, input_sharding=spec, device_prefetch_size=2, loader_prefetch_size=1))
    assert [o.cpu()[0, 0].item() for o in out] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert {xs.get_sharding_spec(o) for o in out} == {"{devices=[8,1]<=[8]}"}
    batch = next(iter(MpDeviceLoader([{"x": torch.ones(8, 3), "n": 3}], dev, input_sharding={"x": spec})))
    assert xs.get_sharding_spec(batch["x"]) == "{devices=[8,1]<=[8]}" and batch["n"] == 3
    with pytest.raises(ValueError, match="device_prefetch_size"):
        MpDeviceLoader(data, dev, device_prefetch_size=0)


def test_checkpoint_manager_async_keep_and_restore(mesh, dev, tmp_path):
    import torch.distributed.checkpoint as dcp
    w = torch.arange(16.).reshape(8, 2).to(dev)
    xs.mark_sharding(w, mesh, ("x", None))
    mgr = CheckpointManager(tmp_path / "ck", save_interval=2, max_to_keep=2)
    assert not mgr.save(1, {"w": w})
    for step in (2, 4, 6):
        assert mgr.save_async(step, {"w": w * step})
    mgr.join()
    assert mgr.all_steps() == [4, 6]
    target = torch.zeros(8, 2).to(dev)
    xs.mark_sharding(target, mesh, (("x", "y"), None))  # another layout than the saved one
    assert mgr.restore_latest({"w": target}) == 6
    assert torch.equal(target.cpu(), torch.arange(16.).reshape(8, 2) * 6)
    with pytest.raises(ValueError, match=r"saved steps: \[4, 6\]"):
        mgr.load(2, {"w": target})
    with pytest.raises(ValueError, match="save_interval"):
        CheckpointManager(tmp_path, save_interval=0)
    dcp.save({"w": w}, storage_writer=dcp.FileSystemWriter(str(tmp_path / "plain")), planner=SPMDSavePlanner(),
             no_dist=True)
    out = {"w": torch.zeros(8, 2)}
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(tmp_path / "plain")), no_dist=True)
    assert torch.equal(out["w"], torch.arange(16.).reshape(8, 2))


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.l(x))


def test_fsdpv2_wrap_policy_extra_axis_matches_cpu(dev):
    import copy

    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    mesh = xs.Mesh(range(8), (2, 4), ("data", "fsdp"))
    torch.manual_seed(0)
    ref = torch.nn.Sequential(_Block(), _Block(), torch.nn.Linear(8, 4))
    wrapped: list[str] = []

    def wrapper(m: torch.nn.Module, *a, **kw) -> torch.nn.Module:
        wrapped.append(type(m).__name__)
        return SpmdFullyShardedDataParallel(m, mesh=mesh, extra_data_axis="data")
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={_Block})
    m = SpmdFullyShardedDataParallel(copy.deepcopy(ref), mesh=mesh, extra_data_axis="data",
                                     auto_wrap_policy=policy, auto_wrapper_callable=wrapper)
    assert wrapped == ["_Block", "_Block"] and isinstance(m.module[2], torch.nn.Linear)
    assert xs.get_sharding_spec(m.module[0].module.l.weight) == "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    x = torch.randn(16, 8)
    out = m(x.to(dev))
    assert xs.get_sharding_spec(out) == "{devices=[8,1]<=[8]}"
    assert torch.allclose(out.cpu(), ref(x), atol=1e-5)
    with pytest.raises(ValueError, match="'fsdp'"):
        SpmdFullyShardedDataParallel(torch.nn.Linear(2, 2), mesh=xs.Mesh(range(8), (8,), ("dp",)))
