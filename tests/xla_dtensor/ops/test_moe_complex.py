"""MoE routing and complex-rotary lowerings against torch CPU: histc, bincount, _grouped_mm, complex views.

Each op is checked as a lowering (``check``: same shapes, dtypes, values as torch CPU), then
on the lazy device, and on inputs sharded over the 8 virtual devices (1x8 and 2x4 meshes).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import xla_dtensor
from tests.xla_dtensor.ops.harness import T, check

aten = torch.ops.aten
f32, f64, bf16, i32, i64 = torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64
MESHES = {"1x8": ((8,), ("dp",)), "2x4": ((2, 4), ("dp", "tp"))}


@pytest.fixture(scope="module")
def dev() -> torch.device:
    return xla_dtensor.device()


def _mesh(name: str) -> DeviceMesh:
    shape, names = MESHES[name]
    return DeviceMesh("xla", np.arange(8).reshape(shape).tolist(), mesh_dim_names=names)


def _on(mesh: DeviceMesh, t: torch.Tensor, dim: int | None) -> torch.Tensor:
    """``t`` on ``mesh``, split along ``dim`` over the mesh's first axis (replicated when ``None``)."""
    first = Shard(dim) if dim is not None else Replicate()
    return distribute_tensor(t, mesh, [first] + [Replicate()] * (mesh.ndim - 1))


# ---------------------------------------------------------------- histc


@pytest.mark.parametrize("dtype", [f32, f64])
def test_histc_matches_cpu(dtype: torch.dtype) -> None:
    x = T(64, dtype=dtype, low=-1, high=5)
    check(aten.histc.default, x, 4, 0, 3, jit=True)  # values outside [0, 3] are dropped
    check(aten.histc.default, x, 7, -0.5, 4.25, jit=True)
    check(aten.histc.default, x, 10, jit=True)  # min == max == 0: the data's range
    check(aten.histc.default, x, 5, 2, 2, jit=True)  # min == max: the data's range
    check(aten.histc.default, torch.full((5,), 2.0, dtype=dtype), 4, jit=True)  # constant data: widened by 1
    check(aten.histc.default, torch.tensor([0.0, 1.0, 3.0, float("nan"), 3.0], dtype=dtype), 3, 0, 3, jit=True)
    check(aten.histc.default, torch.tensor([], dtype=dtype), 3, 0, 1, jit=True)
    check(aten.histc.default, T(3, 4, dtype=dtype), 6, -2, 2, jit=True)  # any rank: flattened


def test_histc_bf16_and_integer_inputs(dev: torch.device) -> None:
    check(aten.histc.default, T(40, dtype=bf16, low=0, high=4), 4, 0, 3, jit=True)
    # torch's CPU kernel refuses integers (CUDA counts them): the oracle is the float count, cast
    ids = torch.randint(0, 6, (50,), generator=torch.Generator().manual_seed(3))
    for dt in (i32, i64):
        want = torch.histc(ids.float(), 6, 0, 5).to(dt)
        got = torch.histc(ids.to(dt).to(dev), 6, 0, 5).cpu()
        assert got.dtype == dt and torch.equal(got, want)


def test_histc_on_device_with_scalar_parameters(dev: torch.device) -> None:
    x = T(100, low=-1, high=9)
    for lo, hi in [(0, 7), (0.5, 7.5), (2, 2), (0, 0)]:  # min/max other than 0 and 1 are program inputs
        torch.testing.assert_close(torch.histc(x.to(dev), 8, lo, hi).cpu(), torch.histc(x, 8, lo, hi))
    with pytest.raises(RuntimeError, match="max must be larger than min"):
        torch.histc(x.to(dev), 8, 3, 1)


def test_histogram_matches_cpu() -> None:
    x = T(50, low=-1, high=5)
    check(aten.histogram.bin_ct, x, 6, jit=True)
    check(aten.histogram.bin_ct, x, 4, range=[0.0, 3.0], weight=T(50, low=0, high=2), density=True, jit=True)
    check(aten.histogram.bin_ct, torch.full((4,), 2.0), 4, jit=True)  # empty range: widened by 0.5
    check(aten.histogram.bin_ct, T(3, 4, dtype=f64), 5, range=[-1.0, 1.0], jit=True)


# ---------------------------------------------------------------- bincount


def test_bincount_matches_cpu(dev: torch.device) -> None:
    g = torch.Generator().manual_seed(4)
    x = torch.randint(0, 9, (40,), generator=g)
    for kwargs in [{}, {"minlength": 3}, {"minlength": 20}]:
        want = torch.bincount(x, **kwargs)
        got = torch.bincount(x.to(dev), **kwargs).cpu()
        assert got.dtype == want.dtype and torch.equal(got, want)
    for wdt in (f32, f64, bf16, i32):
        w = T(40, dtype=wdt)
        want = torch.bincount(x, weights=w, minlength=12)
        got = torch.bincount(x.to(dev), weights=w.to(dev), minlength=12).cpu()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got, want)
    assert torch.equal(torch.bincount(torch.tensor([], dtype=i64).to(dev), minlength=4).cpu(), torch.zeros(4, dtype=i64))
    assert torch.equal(torch.bincount(x.to(i32).to(dev)).cpu(), torch.bincount(x.to(i32)))


def test_bincount_bad_input(dev: torch.device) -> None:
    with pytest.raises(RuntimeError, match="non-negative integral") as e:
        torch.bincount(torch.tensor([1, -2, 3]).to(dev))
    assert "-2" in str(e.value)
    with pytest.raises(RuntimeError, match="non-negative integral"):
        torch.bincount(torch.tensor([1.0, 2.0]).to(dev))
    with pytest.raises(RuntimeError, match="non-negative integral"):
        torch.bincount(torch.tensor([[1, 2]]).to(dev))
    with pytest.raises(RuntimeError, match="same length"):
        torch.bincount(torch.tensor([1, 2]).to(dev), weights=torch.ones(3).to(dev))


def test_repeat_interleave_and_nonzero_static_match_cpu(dev: torch.device) -> None:
    r = torch.tensor([2, 0, 3, 1])
    x = T(4, 3)
    for dt in (i64, i32):
        want = torch.repeat_interleave(r.to(dt))
        got = torch.repeat_interleave(r.to(dt).to(dev)).cpu()  # the length is read on the host
        assert got.dtype == want.dtype and torch.equal(got, want)
    torch.testing.assert_close(torch.repeat_interleave(x.to(dev), r.to(dev), dim=0).cpu(),
                               torch.repeat_interleave(x, r, dim=0))
    check(aten.repeat_interleave.Tensor, r, output_size=6)  # a given size: no host read
    m = torch.tensor([[0, 3, 0], [5, 0, 1]])
    check(aten.nonzero_static.default, m, size=5, fill_value=-2, strides=False)
    check(aten.nonzero_static.default, m, size=2, strides=False)


def test_data_dependent_op_without_a_host_path_names_the_op_and_line(dev: torch.device) -> None:
    from xla_dtensor.core.dispatch import record
    from xla_dtensor.core.entries import DataDependentShapeError
    x, m = torch.ones(3).to(dev), torch.tensor([True, False, True]).to(dev)
    with pytest.raises(DataDependentShapeError, match="masked_select") as e:
        record(aten.masked_select.default, (x, m), {})  # the dispatcher's host-read path bypassed
    assert f"{__file__}:" in str(e.value)
    with pytest.raises(NotImplementedError, match="special_zeta") as e2:
        torch.special.zeta(x, x)
    assert f"{__file__}:" in str(e2.value)


# ---------------------------------------------------------------- _grouped_mm


def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=i32)


def test_grouped_mm_matches_cpu() -> None:
    # torch's CPU kernel wants 16-byte aligned strides: inner sizes are multiples of 4 (float32)
    check(aten._grouped_mm.default, T(12, 8), T(3, 8, 16), _offs(4, 4, 12), strides=False)  # experts: rows
    check(aten._grouped_mm.default, T(8, 12), T(12, 16), _offs(4, 4, 12), strides=False)    # weight grad: K
    check(aten._grouped_mm.default, T(3, 12, 8), T(8, 16), _offs(4, 8, 16), strides=False)  # columns
    check(aten._grouped_mm.default, T(3, 12, 8), T(3, 8, 16), strides=False)                # batched
    check(aten._grouped_mm.default, T(12, 8, dtype=bf16), T(3, 8, 16, dtype=bf16), _offs(5, 5, 12), strides=False)


def test_grouped_mm_rows_past_the_last_offset_are_zero(dev: torch.device) -> None:
    a, w = T(12, 8), T(3, 8, 16)
    got = torch._grouped_mm(a.to(dev), w.to(dev), offs=_offs(2, 6, 9).to(dev)).cpu()
    want = torch.cat([a[0:2] @ w[0], a[2:6] @ w[1], a[6:9] @ w[2], torch.zeros(3, 16)])  # torch leaves them unset
    torch.testing.assert_close(got, want)
    with pytest.raises(RuntimeError, match="bias"):
        torch._grouped_mm(a.to(dev), w.to(dev), offs=_offs(2, 6, 9).to(dev), bias=torch.ones(3, 16).to(dev))


def test_grouped_mm_backward_matches_cpu(dev: torch.device) -> None:
    a, w, offs = T(12, 8), T(3, 8, 16), _offs(3, 3, 12)
    grads = []
    for d in (None, dev):
        aa = (a.to(d) if d else a.clone()).requires_grad_()
        ww = (w.to(d) if d else w.clone()).requires_grad_()
        out = torch.nn.functional.grouped_mm(aa, ww, offs=offs.to(d) if d else offs)
        (out * out).sum().backward()
        grads.append((aa.grad.cpu(), ww.grad.cpu()))
    torch.testing.assert_close(grads[1], grads[0])


# ---------------------------------------------------------------- complex


def test_complex_ops_match_cpu() -> None:
    x = T(2, 3, 4, 2)
    c = torch.view_as_complex(x)
    check(aten.view_as_complex.default, x, strides=False)
    check(aten.view_as_real.default, c, strides=False)
    check(aten.polar.default, T(3, 4, low=0, high=2), T(3, 4, low=-4, high=4))
    check(aten.complex.default, T(3, 4), T(4))
    check(aten.imag.default, c, strides=False)
    check(aten._conj.default, c, strides=False)
    check(aten.conj_physical.default, c, strides=False)
    check(aten._neg_view.default, c, strides=False)
    check(aten.view_as_complex.default, T(5, 2, dtype=f64), strides=False)


def _rotary(q: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """torchtitan's complex rotary embedding."""
    qc = torch.view_as_complex(q.float().reshape(*q.shape[:-1], -1, 2))
    return torch.view_as_real(qc * freqs.view(1, q.shape[1], 1, -1)).flatten(3).type_as(q)


def test_complex_rotary_forward_backward_matches_cpu(dev: torch.device) -> None:
    q = T(2, 6, 4, 8)
    freqs = torch.polar(torch.ones(6, 4), T(6, 4, low=-3, high=3))
    results = []
    for d in (None, dev):
        qq = (q.to(d) if d else q.clone()).requires_grad_()
        f = torch.polar(torch.ones(6, 4).to(d) if d else torch.ones(6, 4), torch.angle(freqs).to(d) if d else
                        torch.angle(freqs))
        out = _rotary(qq, f)
        (out * torch.arange(8.0).to(d if d else "cpu")).sum().backward()
        results.append((out.detach().cpu(), qq.grad.cpu()))
    torch.testing.assert_close(results[1], results[0], rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------- sharded inputs


@pytest.mark.parametrize("mesh_name", ["1x8", "2x4"])
def test_sharded_inputs_match_cpu(mesh_name: str) -> None:
    mesh = _mesh(mesh_name)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 8, (64,), generator=g)
    torch.testing.assert_close(torch.histc(_on(mesh, ids.float(), 0), 8, 0, 7).cpu(), torch.histc(ids.float(), 8, 0, 7))
    assert torch.equal(torch.bincount(_on(mesh, ids, 0), minlength=10).cpu(), torch.bincount(ids, minlength=10))
    w = T(64)
    torch.testing.assert_close(torch.bincount(_on(mesh, ids, 0), weights=_on(mesh, w, 0)).cpu(),
                               torch.bincount(ids, weights=w))
    # MoE dispatch: rows split over devices, experts split over devices
    a, ew, offs = T(32, 8), T(8, 8, 16), _offs(4, 8, 8, 12, 20, 24, 30, 32)
    want = torch._grouped_mm(a, ew, offs=offs)
    for da, dw in [(0, None), (None, 0), (0, 0)]:
        got = torch._grouped_mm(_on(mesh, a, da), _on(mesh, ew, dw), offs=_on(mesh, offs, None)).cpu()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    q = T(8, 4, 8, 8)
    freqs = torch.polar(torch.ones(4, 4), T(4, 4))
    for dim in (0, 2):  # batch split (data parallel), head split (tensor parallel)
        got = _rotary(_on(mesh, q, dim), _on(mesh, freqs, None)).cpu()
        torch.testing.assert_close(got, _rotary(q, freqs))
