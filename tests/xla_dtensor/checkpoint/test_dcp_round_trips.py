"""torch.distributed.checkpoint round trips, all exact: ours -> ours on another mesh, ours -> plain
torch CPU, plain torch -> ours, plain ``dcp.save`` of our tensors; get/set_state_dict with AdamW.

Oracle: the CPU values of the saved tensors (read with ``.cpu()``, not through the checkpoint
code) and a torch CPU model trained the same way.
"""
from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
from mesh import Mesh
from xla_dtensor import checkpoint

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _place(model: nn.Module, mesh, placements) -> nn.Module:
    """Replace each parameter by our sharded tensor (placements(name, tensor) -> list)."""
    for name, p in list(model.named_parameters()):
        mod, attr = name.rsplit(".", 1)
        t = xla_dtensor.distribute_tensor(p.detach(), mesh, placements(name, p))
        model.get_submodule(mod).register_parameter(attr, nn.Parameter(t))
    return model


def _rowwise(name, p):  # 1-D mesh: weights sharded on dim 0 (16 rows / 8, 4 rows uneven / 8), biases replicated
    return [Shard(0)] if p.dim() == 2 else [Replicate()]


def _colwise_2d(name, p):  # 2x4 mesh: another layout
    return [Replicate(), Shard(p.dim() - 1)]


def _step(model, opt, x):
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


X = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def trained(dev):
    """Our model on a 1x8 mesh after one AdamW step, its state dicts and their CPU values."""
    mesh = DeviceMesh("xla", list(range(8)))
    model = _place(_mlp(), mesh, _rowwise)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt, X.to(dev))
    xla_dtensor.sync()
    msd, osd = get_state_dict(model, opt)
    cpu_m = {k: v.cpu() for k, v in msd.items()}
    cpu_o = {k: {n: v.cpu() if isinstance(v, torch.Tensor) else v for n, v in st.items()}
             for k, st in osd["state"].items()}
    return model, opt, msd, osd, cpu_m, cpu_o


def _fresh_cpu():
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt, torch.zeros(1, 8))  # creates the optimizer state (overwritten by the load)
    return model, opt


def _fresh_ours(dev, mesh, placements):
    model = _place(_mlp(), mesh, placements)
    for p in model.parameters():
        p.data.zero_()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    _step(model, opt, torch.zeros(1, 8).to(dev))
    return model, opt


def _assert_state(model, opt, cpu_m, cpu_o):
    for k, v in cpu_m.items():
        assert torch.equal(model.state_dict()[k].cpu(), v), k
    for k, p in model.named_parameters():
        for n in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt.state[p][n].cpu(), cpu_o[k][n]), (k, n)


def test_ours_to_ours_on_another_mesh_is_exact_and_keeps_the_target_layout(trained, dev, tmp_path):
    _, _, msd, osd, cpu_m, cpu_o = trained
    checkpoint.save({"model": msd, "optim": osd}, tmp_path / "c")
    mesh2 = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]])
    model, opt = _fresh_ours(dev, mesh2, _colwise_2d)
    m2, o2 = get_state_dict(model, opt)
    checkpoint.load({"model": m2, "optim": o2}, tmp_path / "c")
    set_state_dict(model, opt, model_state_dict=m2, optim_state_dict=o2)
    _assert_state(model, opt, cpu_m, cpu_o)
    assert model[0].weight.placements == (Replicate(), Shard(1))
    # training goes on like torch CPU from the same state
    ref, ref_opt = _fresh_cpu()
    ref.load_state_dict(cpu_m)
    for k, p in ref.named_parameters():
        ref_opt.state[p].update({n: cpu_o[k][n].clone() for n in ("exp_avg", "exp_avg_sq", "step")})
    _step(model, opt, X.to(dev))
    _step(ref, ref_opt, X)
    for k, v in ref.state_dict().items():
        torch.testing.assert_close(model.state_dict()[k].cpu(), v, rtol=1e-5, atol=1e-6)


def test_ours_to_plain_torch_cpu_with_dcp_load(trained, tmp_path):
    _, _, msd, osd, cpu_m, cpu_o = trained
    checkpoint.save({"model": msd, "optim": osd}, tmp_path / "c")
    model, opt = _fresh_cpu()
    m2, o2 = get_state_dict(model, opt)
    dcp.load({"model": m2, "optim": o2}, checkpoint_id=str(tmp_path / "c"))  # torch's own reader
    set_state_dict(model, opt, model_state_dict=m2, optim_state_dict=o2)
    _assert_state(model, opt, cpu_m, cpu_o)


def test_plain_torch_to_ours(dev, tmp_path):
    ref, ref_opt = _fresh_cpu()
    _step(ref, ref_opt, X)
    m, o = get_state_dict(ref, ref_opt)
    dcp.save({"model": m, "optim": o}, checkpoint_id=str(tmp_path / "c"))
    cpu_m = {k: v.clone() for k, v in ref.state_dict().items()}
    cpu_o = {k: {n: ref_opt.state[p][n].clone() for n in ("exp_avg", "exp_avg_sq", "step")}
             for k, p in ref.named_parameters()}
    mesh = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]])
    for how in ("dcp.load", "checkpoint.load"):
        model, opt = _fresh_ours(dev, mesh, _colwise_2d)
        m2, o2 = get_state_dict(model, opt)
        if how == "dcp.load":
            dcp.load({"model": m2, "optim": o2}, checkpoint_id=str(tmp_path / "c"))
        else:
            with pytest.raises(checkpoint.CheckpointError, match="allow_unverified=True"):
                checkpoint.load({"model": m2, "optim": o2}, tmp_path / "c")
            checkpoint.load({"model": m2, "optim": o2}, tmp_path / "c", allow_unverified=True)
        set_state_dict(model, opt, model_state_dict=m2, optim_state_dict=o2)
        _assert_state(model, opt, cpu_m, cpu_o)


def test_plain_dcp_save_of_our_tensors_reshards_on_load(trained, dev, tmp_path):
    _, _, msd, osd, cpu_m, cpu_o = trained
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(tmp_path / "c"))  # torch's own writer
    mesh = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]])
    model, opt = _fresh_ours(dev, mesh, _colwise_2d)
    m2, o2 = get_state_dict(model, opt)
    dcp.load({"model": m2, "optim": o2}, checkpoint_id=str(tmp_path / "c"))
    set_state_dict(model, opt, model_state_dict=m2, optim_state_dict=o2)
    _assert_state(model, opt, cpu_m, cpu_o)


def test_every_dtype_and_layout_round_trips_exactly(dev, tmp_path):
    mesh = Mesh(range(8), (2, 4), ("a", "b"))
    g = torch.Generator().manual_seed(3)
    src = {
        "w": torch.randn(8, 12, generator=g),                        # sharded on both axes
        "u": torch.randn(10, 3, generator=g),                        # uneven rows (padded layout)
        "r": torch.randn(5, generator=g),                            # replicated
        "bf": torch.randn(4, 8, generator=g).to(torch.bfloat16),
        "i": torch.randint(-2**40, 2**40, (6,), generator=g),         # int64
        "b": torch.rand(8, generator=g) > 0.5,
        "s": torch.tensor(2.5),                                       # 0-d
        "e": torch.zeros(0, 3),                                       # empty
    }
    layouts = {"w": [Shard(0), Shard(1)], "u": [Shard(0), Replicate()], "r": [Replicate(), Replicate()],
               "bf": [Replicate(), Shard(1)], "i": [Shard(0), Replicate()], "b": [Replicate(), Shard(0)]}
    sd = {k: xla_dtensor.distribute_tensor(v, mesh, layouts[k]) if k in layouts else v.to(dev) for k, v in src.items()}
    sd["meta"] = {"step": 7, "name": "run-1", "betas": (0.9, 0.95), "none": None}
    checkpoint.save(sd, tmp_path / "c")
    man = json.loads((tmp_path / "c" / ".xdt_manifest.json").read_text())
    assert sorted(os.listdir(tmp_path / "c")) == [".metadata", ".xdt_manifest.json", "__0_0.distcp"]
    assert len(man["entries"]["w"]["chunks"]) == 8      # one piece per device, nothing gathered
    assert len(man["entries"]["u"]["chunks"]) == 2      # replicas written once, padding cut off
    assert len(man["entries"]["r"]["chunks"]) == 1
    other = {"w": [Shard(1), Replicate()], "u": [Replicate(), Shard(0)], "bf": [Shard(0), Replicate()],
             "i": [Replicate(), Replicate()], "b": [Shard(0), Replicate()]}
    tgt = {k: xla_dtensor.distribute_tensor(torch.zeros_like(v), mesh, other[k]) if k in other else torch.zeros_like(v)
           for k, v in src.items()}  # "r", "s", "e": plain CPU tensors
    tgt["meta"] = {"step": 0, "name": "", "betas": (0.0, 0.0), "none": 1}
    out = checkpoint.load(tgt, tmp_path / "c")
    for k, v in src.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k].cpu(), v), k
    assert out["meta"] == {"step": 7, "name": "run-1", "betas": (0.9, 0.95), "none": None}
    assert out["w"].placements == (Shard(1), Replicate()) and not out["r"].is_meta and out["r"].device.type == "cpu"


def test_save_replaces_an_earlier_checkpoint_atomically(dev, tmp_path):
    mesh = Mesh(range(8), (8,), ("x",))
    for gen in (1.0, 2.0):
        checkpoint.save({"w": xla_dtensor.distribute_tensor(torch.full((16, 2), gen), mesh, [Shard(0)])}, tmp_path / "c")
    out = checkpoint.load({"w": torch.zeros(16, 2)}, tmp_path / "c")
    assert torch.equal(out["w"], torch.full((16, 2), 2.0))
    assert sorted(os.listdir(tmp_path)) == ["c"]  # no staging or old copy left behind
