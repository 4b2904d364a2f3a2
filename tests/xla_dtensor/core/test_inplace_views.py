"""In-place ops and views on the jax device keep torch CPU semantics."""
from __future__ import annotations

import pytest
import torch

import xla_dtensor


def _both(fn, dev):
    base = torch.arange(24.0).reshape(4, 6)
    cpu, lazy = base.clone(), base.clone().to(dev)
    out_c, out_l = fn(cpu), fn(lazy)
    assert (lazy.shape, lazy.stride()) == (cpu.shape, cpu.stride())
    torch.testing.assert_close(lazy.cpu(), cpu)
    if isinstance(out_c, torch.Tensor):
        torch.testing.assert_close(out_l.cpu(), out_c)


CASES = {
    "add_": lambda t: t.add_(2.5),
    "mul_scalar_tensor": lambda t: t.mul_(torch.full((6,), 3.0, device=t.device)),
    "zero_": lambda t: t.zero_(),
    "copy_from_cpu": lambda t: t.copy_(torch.ones(6)),
    "slice_write": lambda t: t.__setitem__((slice(1, 3), slice(None, None, 2)), -1.0),
    "setitem_tensor": lambda t: t.__setitem__(0, torch.arange(6.0, device=t.device) * 10),
    "view_inplace": lambda t: t.view(24)[5:9].add_(100),
    "view_of_view": lambda t: t[1:].t()[2].mul_(-1),
    "transpose_then_slice_fill": lambda t: t.t()[1:3, 0:2].fill_(7),
    "write_then_read_other_view": lambda t: (t[0].add_(1), t[:, 0].clone())[1],
    "base_write_refreshes_view": lambda t: (lambda v: (t.add_(1000), v.clone())[1])(t[2, 1:4]),
    "chained_inplace": lambda t: t.add_(1).mul_(2).sub_(3),
    "unbind_write": lambda t: t.unbind(0)[3].zero_(),
    "split_write": lambda t: t.split(2, dim=1)[1].add_(0.5),
    "detach_aliases": lambda t: t.detach().add_(9),
    "t_then_write": lambda t: t.t_()[1].mul_(-2),
    "transpose_view_then_write": lambda t: t[1:].transpose_(0, 1)[0].zero_(),
    "unsqueeze_squeeze_": lambda t: t.unsqueeze_(1).add_(1).squeeze_(1).sub_(0.5),
    "squeeze_dims_of_view": lambda t: t.view(1, 4, 1, 6).squeeze_((0, 2))[3].fill_(4),
}


@pytest.mark.parametrize("name", list(CASES))
def test_inplace_and_views_match_cpu(dev, name):
    _both(CASES[name], dev)


def test_view_survives_sync_and_later_base_write(dev):
    t = torch.zeros(3, 3, device=dev)
    v = t[1]
    v.add_(1)
    xla_dtensor.sync()
    t.add_(10)
    assert v.tolist() == [11.0, 11.0, 11.0]
    v[0] = -5
    assert t.tolist() == [[10.0] * 3, [-5.0, 11.0, 11.0], [10.0] * 3]


def test_inplace_dtype_cast_and_error_like_torch(dev):
    t = torch.zeros(3, device=dev)
    t.add_(torch.ones(3, dtype=torch.float64, device=dev))
    assert t.dtype == torch.float32 and t.tolist() == [1.0, 1.0, 1.0]
    i = torch.zeros(3, dtype=torch.int64, device=dev)
    with pytest.raises(RuntimeError, match="can't be cast"):
        i.add_(1.5)


@pytest.mark.parametrize("layout", [None, ("dp", "tp"), ("tp", None)])
def test_vector_matmul_and_cpu_scalar_fill_sharded(dev, layout):
    """torch's matmul of a vector and a matrix ends in ``squeeze_`` (an in-place view op), and masked_fill
    takes a 0-dim CPU value: both with the matrix on one device and split over a 2x4 mesh, against
    torch CPU, gradients included."""
    import xla_dtensor.spmd as xs
    w, v = torch.randn(8, 12, requires_grad=True), torch.randn(8, requires_grad=True)
    wd, vd = w.detach().to(dev).requires_grad_(), v.detach().to(dev).requires_grad_()
    if layout:
        xs.mark_sharding(wd, xs.Mesh(range(8), (2, 4), ("dp", "tp")), layout)
    outs = []
    for a, b in ((v, w), (vd, wd)):
        y = torch.matmul(a, b)
        z = y.masked_fill(y > 0, torch.tensor(0.5))
        z.square().sum().backward()
        outs.append((z, a.grad, b.grad))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got.cpu(), want.detach())
