"""torch's optimizers over sharded (``XLAShardedTensor``) parameters: the fused step by default
(``xla_dtensor/core/fused_optim.py``), the multi-tensor path for ``foreach=True``, against torch CPU."""
from __future__ import annotations

import copy

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.optim.optimizer import _default_to_fused_or_foreach

import xla_dtensor
from xla_dtensor.core import dispatch as D
from xla_dtensor.spmd import XLAShardedTensor


def _shard(name, module, mesh):
    if isinstance(module, nn.Linear):
        module.register_parameter("weight", nn.Parameter(distribute_tensor(module.weight, mesh, [Shard(0)])))
        module.register_parameter("bias", nn.Parameter(distribute_tensor(module.bias, mesh, [Replicate()])))


def _steps(model, x, foreach, monkeypatch=None):
    """Parameters after two AdamW steps, and the aten ops the second ``opt.step()`` issued."""
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, foreach=foreach)
    issued = []
    real = D.dispatch

    def counting(func, args, kwargs):
        issued.append(func)
        return real(func, args, kwargs)

    for _ in range(2):
        model(x).square().mean().backward()
        issued.clear()
        if monkeypatch is not None:
            monkeypatch.setattr(D, "dispatch", counting)
        opt.step()
        if monkeypatch is not None:
            monkeypatch.setattr(D, "dispatch", real)
        opt.zero_grad()
    return [p.detach().cpu() for p in model.parameters()], [str(f) for f in issued]


def test_adamw_defaults_to_fused_on_sharded_params_and_matches_cpu(monkeypatch):
    torch.manual_seed(0)
    ref = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(4, 8)
    mesh = DeviceMesh("xla", list(range(4)))
    runs = {}
    for foreach in (None, True, False):
        mod = distribute_module(copy.deepcopy(ref), mesh, _shard)
        params = list(mod.parameters())
        assert all(isinstance(p, XLAShardedTensor) for p in params)
        if foreach is None:  # torch's own choice for these types: foreach (the fused step is ours)
            assert _default_to_fused_or_foreach(params, False, False) == (False, True)
        runs[foreach] = _steps(mod, x.to(xla_dtensor.device()), foreach, monkeypatch)
    want, _ = _steps(ref, x, foreach=False)
    for got, _ in runs.values():
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)
    fused, multi, single = runs[None][1], runs[True][1], runs[False][1]
    assert fused == ["aten._foreach_add_.Scalar", "aten._fused_adamw_.default"], fused  # the counters, the step
    assert multi and all(op.startswith("aten._foreach_") for op in multi), multi  # one op per parameter list
    assert not any(op.startswith("aten._foreach_") for op in single) and len(single) >= 2 * len(multi), single
