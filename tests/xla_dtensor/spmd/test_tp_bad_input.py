"""Bad tensor-parallel plans: a specific error naming the module and what is allowed, and the
module left exactly as it was (same parameter objects, no hooks)."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
from torch.distributed.tensor.parallel import parallelize_module as torch_parallelize

import xla_dtensor.spmd as xs
from xla_dtensor.sharding import RankError


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))


def _state(m: nn.Module) -> list:
    ids = lambda d: {k: id(v) for k, v in d.items()}  # noqa: E731
    return [(name, id(sub), ids(sub._parameters), ids(sub._buffers), ids(sub._forward_hooks),
             ids(sub._forward_pre_hooks), getattr(sub, "_distribute_module_applied", None))
            for name, sub in m.named_modules()]


@pytest.fixture(scope="module")
def tp():
    return init_device_mesh("xla", (8,), mesh_dim_names=("tp",))


def test_plan_key_naming_no_submodule(tp):
    m = Net()
    before = _state(m)
    with pytest.raises(xs.PlanError, match=r"'mlp\.9'.*Net\.mlp: no child matches '9' \(children: \['0', '1', '2'\]\)"):
        xs.parallelize_module(m, tp, {"mlp.0": ColwiseParallel(), "mlp.9": RowwiseParallel()})
    assert _state(m) == before   # the valid first entry was not applied either


def test_style_on_a_module_type_it_does_not_support(tp):
    m = Net()
    before = _state(m)
    with pytest.raises(NotImplementedError, match=r"norm \(LayerNorm\): ColwiseParallel currently only support "
                                                  r"nn.Linear and nn.Embedding"):
        xs.parallelize_module(m, tp, {"mlp.0": ColwiseParallel(), "norm": ColwiseParallel()})
    assert _state(m) == before
    with pytest.raises(NotImplementedError, match="only support nn.Linear"):   # torch's own function, alone
        torch_parallelize(m.norm, tp, ColwiseParallel())
    assert _state(m) == before


def test_a_2d_mesh_for_one_placement_per_tensor():
    dm = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    m = Net()
    before = _state(m)
    with pytest.raises(RankError, match=r"1-D mesh.*2-D mesh with dims \('dp', 'tp'\).*device_mesh\['tp'\]"):
        xs.parallelize_module(m, dm, {"mlp.0": ColwiseParallel()})
    assert _state(m) == before
    # torch's own parallelize_module: the placement list of the wrong length is caught in
    # distribute_module, which names the module and puts its parameters back
    with pytest.raises(RankError, match=r"Linear: 1 placements \[Shard\(dim=0\)\] for a 2-D mesh"):
        torch_parallelize(m.mlp[0], dm, ColwiseParallel())
    assert _state(m) == before


def test_failure_inside_torchs_function_restores_everything(tp, monkeypatch):
    m = Net()
    before = _state(m)

    def boom(self, name, module, device_mesh):
        raise RuntimeError("partition failed")
    monkeypatch.setattr(SequenceParallel, "_replicate_module_fn", boom)
    with pytest.raises(RuntimeError, match="partition failed"):
        xs.parallelize_module(m, tp, {"mlp.0": ColwiseParallel(), "norm": SequenceParallel()})
    assert _state(m) == before   # mlp.0 had been sharded and hooked: all of it undone


def test_redistribute_to_another_meshs_devices(tp):
    d = xs.distribute_tensor(torch.ones(8, 2), init_device_mesh("xla", (4,)), [Shard(0)])
    other = xs.Mesh([4, 5, 6, 7], (4,), ("x",))
    with pytest.raises(xs.MeshDevicesError, match=r"on devices \[0, 1, 2, 3\].*has \[4, 5, 6, 7\]"):
        d.redistribute(other, [Shard(0)])
    assert d.placements == (Shard(0),) and torch.equal(d.cpu(), torch.ones(8, 2))
