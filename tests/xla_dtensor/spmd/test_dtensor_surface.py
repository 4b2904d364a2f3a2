"""The DTensor surface of XLAShardedTensor under single-controller SPMD, through torch's own
``DTensor.from_local`` on an 'xla' mesh: values against torch CPU, layouts hand-derived."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor import metrics
from xla_dtensor.sharding import PlacementError, RankError

DM8 = DeviceMesh("xla", list(range(8)))
DM24 = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("dp", "tp"))


def _dev(t: torch.Tensor) -> torch.Tensor:
    return t.to(xla_dtensor.device())


def test_from_local_is_the_global_value_laid_out_and_to_local_its_inverse():
    x = torch.randn(8, 8)
    d = DTensor.from_local(_dev(x), DM24, [Shard(0), Shard(1)])
    assert isinstance(d, xs.XLAShardedTensor) and tuple(d.shape) == (8, 8)   # no shape change
    before = metrics.counters()
    assert d.placements == (Shard(0), Shard(1))          # known without running anything
    assert metrics.diff(before)["executions"] == 0
    local = d.to_local()
    assert type(local) is xla_dtensor.LazyTensor
    torch.testing.assert_close(local.cpu(), x)
    # each device holds the block the placements say: rows by dp, columns by tp
    for s in d.local_shards:
        r, c = divmod(s.device_id, 4)
        torch.testing.assert_close(s.data, x[r * 4:(r + 1) * 4, c * 2:(c + 1) * 2])


def test_from_local_of_a_cpu_tensor_places_it_and_routes_the_gradient_back():
    w = torch.randn(8, 3, requires_grad=True)
    d = DTensor.from_local(w, DM8, [Shard(0)])
    assert [tuple(s.data.shape) for s in d.local_shards] == [(1, 3)] * 8
    (d.to_local() * torch.arange(3.).to(xla_dtensor.device())).sum().backward()
    torch.testing.assert_close(w.grad, torch.arange(3.).expand(8, 3))


def test_partial_is_a_pending_reduction_until_redistributed():
    x = torch.randn(16, 4)
    p = DTensor.from_local(_dev(x), DM8, [Partial()])
    assert p.placements == (Partial(),)
    s = p.redistribute(DM8, [Shard(0)])
    r = p.redistribute(placements=[Replicate()], async_op=True)
    assert s.placements == (Shard(0),) and r.placements == (Replicate(),)
    torch.testing.assert_close(s.full_tensor().cpu(), x)   # the value is the reduced one, unchanged
    torch.testing.assert_close(r.to_local().cpu(), x)
    assert [tuple(sh.data.shape) for sh in s.local_shards] == [(2, 4)] * 8


def test_redistribute_gradient_comes_back_in_the_source_layout():
    x = torch.randn(8, 4)
    d = xla_dtensor.distribute_tensor(x, DM8, [Shard(0)]).requires_grad_()
    y = d.redistribute(DM8, [Replicate()])
    (y.to_local() ** 2).sum().backward()
    xla_dtensor.sync()
    torch.testing.assert_close(d.grad.cpu(), 2 * x)
    assert xs.get_spec(d.grad).to_partition_spec() == (0, None)   # Shard(0), as the source


def test_full_tensor_and_forward_dtype():
    x = torch.randn(4, 8)
    d = DTensor.from_local(_dev(x), DM24, [Replicate(), Shard(1)])
    full = d.full_tensor()
    assert type(full) is xla_dtensor.LazyTensor
    torch.testing.assert_close(full.cpu(), x)
    h = d.redistribute(DM24, [Shard(0), Replicate()], forward_dtype=torch.bfloat16)
    assert h.dtype == torch.bfloat16 and h.placements == (Shard(0), Replicate())
    np.testing.assert_allclose(h.to_local().float().cpu().numpy(), x.bfloat16().float().numpy())


def test_ops_on_from_local_results_match_cpu_and_stay_differentiable():
    a, b = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    la, lb = _dev(a.detach()).requires_grad_(), _dev(b.detach()).requires_grad_()
    da, db = DTensor.from_local(la, DM8, [Shard(1)]), DTensor.from_local(lb, DM8, [Shard(0)])
    out = (da @ db).redistribute(DM8, [Replicate()]).to_local()   # a Partial product, reduced
    (out.sin().sum()).backward()
    (a @ b).sin().sum().backward()
    torch.testing.assert_close(out.cpu(), (a @ b).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(la.grad.cpu(), a.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lb.grad.cpu(), b.grad, rtol=1e-5, atol=1e-5)


def test_bad_placements_and_shapes_raise_and_name_the_values():
    x = _dev(torch.ones(4, 4))
    with pytest.raises(RankError, match=r"2 placements .* 1-D mesh"):
        DTensor.from_local(x, DM8, [Shard(0), Shard(1)])
    with pytest.raises(PlacementError, match="shards dim 2"):
        DTensor.from_local(x, DM8, [Shard(2)])
    with pytest.raises(ValueError, match=r"shape=\(32, 4\).*global value"):
        DTensor.from_local(x, DM8, [Shard(0)], shape=(32, 4))
    d = DTensor.from_local(x, DeviceMesh("xla", [0, 1, 2, 3]), [Shard(0)])
    with pytest.raises(xs.MeshDevicesError, match=r"\[0, 1, 2, 3\].*\[4, 5, 6, 7\]"):
        d.redistribute(DeviceMesh("xla", [4, 5, 6, 7]), [Shard(0)])
    with pytest.raises(RankError, match="1 placements"):
        d.redistribute(DeviceMesh("xla", [[0, 1], [2, 3]]), [Shard(0)])
    assert d.placements == (Shard(0),)   # unchanged by the failed calls
