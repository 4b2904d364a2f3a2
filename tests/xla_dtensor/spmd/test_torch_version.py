"""Sharded tensors on a torch that bypasses DTensor subclasses' ``__torch_dispatch__``.

torch 2.10 and 2.11 send every DTensor subclass through DTensor's C++ dispatcher
(pytorch/pytorch#177716): there ``XLAShardedTensor.detach()`` came back a plain ``DTensor``
(seen on the lent GPU machine's torch 2.11), and AUTO failed deep inside ``nn.Parameter``.
The first sharded tensor now probes for it and raises ``TorchVersionError``. The probe is
checked against what a real sharded tensor does on this torch; the refusal by making the
probe answer as torch 2.11's dispatcher does.
"""
from __future__ import annotations

import re

import pytest
import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard

import xla_dtensor
from xla_dtensor.spmd import sharded_tensor as S
from xla_dtensor.spmd.errors import TorchVersionError


def test_probe_matches_a_real_sharded_tensor() -> None:
    d = xla_dtensor.distribute_tensor(torch.arange(8.0), DeviceMesh("xla", list(range(4))), [Shard(0)])
    ours = type(d.detach()) is S.XLAShardedTensor and type(d + 1) is S.XLAShardedTensor
    assert S.subclass_dispatch_works() is ours


@pytest.fixture
def old_torch(monkeypatch: pytest.MonkeyPatch):
    """The probe answers as on torch 2.11: DTensor's dispatcher reads the probe's unset ``_spec``."""
    def bypassing(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        return args[0]._spec  # what DTensor's own dispatcher does first: the slot is unset
    monkeypatch.setattr(S._Probe, "__torch_dispatch__", classmethod(bypassing))
    S.subclass_dispatch_works.cache_clear()
    yield
    monkeypatch.undo()
    S.subclass_dispatch_works.cache_clear()  # the next sharded tensor probes this torch again


def test_old_torch_refuses_distribute_tensor(old_torch: None) -> None:
    t = torch.arange(8.0)
    before = t.clone()
    with pytest.raises(TorchVersionError, match=rf"torch >= 2\.12; torch {re.escape(torch.__version__)} .*#177716"):
        xla_dtensor.distribute_tensor(t, DeviceMesh("xla", list(range(4))), [Shard(0)])
    assert torch.equal(t, before)


def test_old_torch_refuses_auto_and_leaves_the_module(old_torch: None) -> None:
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 4))
    params = {k: (p, p.detach().clone()) for k, p in model.named_parameters()}
    with pytest.raises(TorchVersionError):
        xla_dtensor.distribute_module(model, DeviceMesh("xla", list(range(8))), partition_fn="AUTO")
    for k, p in model.named_parameters():
        assert p is params[k][0] and p.device.type == "cpu" and torch.equal(p, params[k][1])
