"""distribute_module semantics (torch's, on an xla mesh) and the sharded checkpoint round trip."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor import checkpoint


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _shard_linears(name, module, mesh):
    if isinstance(module, nn.Linear):
        module.register_parameter("weight", nn.Parameter(distribute_tensor(module.weight, mesh, [Shard(0)])))


def test_distribute_module_partition_and_hooks_match_cpu():
    ref = _mlp()
    mod = _mlp()
    mesh = DeviceMesh("xla", list(range(4)))
    seen = []

    def input_fn(module, inputs, device_mesh):
        seen.append(device_mesh)
        return tuple(i.to(xla_dtensor.device()) for i in inputs)

    def output_fn(module, outputs, device_mesh):
        return outputs * 2

    out = torch.distributed.tensor.distribute_module(mod, mesh, _shard_linears, input_fn, output_fn)
    assert out is mod and seen == []
    assert mod[0].weight.placements == (Shard(0),) and mod[0].bias.placements == (Replicate(),)
    x = torch.randn(3, 8)
    torch.testing.assert_close(mod(x).cpu(), ref(x) * 2, rtol=1e-5, atol=1e-5)
    assert seen == [mesh]
    with pytest.raises(RuntimeError, match="only be called once"):
        distribute_module(mod, mesh)


def test_partition_fn_none_replicates_and_two_arg_warns():
    mod = distribute_module(_mlp(), DeviceMesh("xla", list(range(8))))
    assert all(isinstance(p, xs.XLAShardedTensor) and p.placements == (Replicate(),) for p in mod.parameters())
    with pytest.warns(DeprecationWarning, match="2-argument partition_fn"):
        distribute_module(_mlp(), DeviceMesh("xla", list(range(8))), lambda name, m: None)


def test_partition_fn_auto_defers_layouts_to_the_plan():
    """AUTO moves parameters to the devices unannotated; tests/xla_dtensor/auto/test_auto_policy.py plans them."""
    mod = xla_dtensor.distribute_module(_mlp(), DeviceMesh("xla", list(range(8))), "AUTO")
    assert all(isinstance(p, xs.XLAShardedTensor) and xs.annotate.sticky_spec(p) is None for p in mod.parameters())
    with pytest.raises(ValueError, match="'auto'"):
        xla_dtensor.distribute_module(_mlp(), DeviceMesh("xla", list(range(8))), "auto")


def test_checkpoint_of_a_sharded_model(tmp_path):
    mesh = DeviceMesh("xla", list(range(4)))
    mod = distribute_module(_mlp(), mesh, _shard_linears)
    checkpoint.save(mod.state_dict(), str(tmp_path / "c"))  # (more in tests/xla_dtensor/checkpoint/)
    fresh = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    fresh = distribute_module(fresh, mesh, _shard_linears)
    checkpoint.load(fresh.state_dict(), str(tmp_path / "c"))
    x = torch.randn(2, 8)
    with warnings.catch_warnings():
        torch.testing.assert_close(fresh(x.to(xla_dtensor.device())).cpu(), _mlp()(x), rtol=1e-5, atol=1e-6)
