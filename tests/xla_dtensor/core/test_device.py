"""Device basics against torch CPU eager: creation, transfers, printing, errors."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch

import xla_dtensor
from xla_dtensor.core.device import DeviceRegistrationError, register


def test_device_name_and_type(dev):
    assert dev == torch.device("jax", 0)
    t = torch.ones(2, device=dev)
    assert t.device.type == "jax" and t.is_jax


@pytest.mark.parametrize("make", [
    lambda d: torch.zeros(2, 3, device=d),
    lambda d: torch.ones(4, dtype=torch.int32, device=d),
    lambda d: torch.full((2, 2), 3.5, device=d),
    lambda d: torch.arange(7, device=d),
    lambda d: torch.arange(1.0, 4.0, 0.5, device=d),
    lambda d: torch.eye(3, device=d),
])
def test_deterministic_creation_matches_cpu(dev, make):
    got, want = make(dev), make("cpu")
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got.cpu(), want)


def test_random_creation_shapes_dtypes_and_ranges(dev):
    xla_dtensor.manual_seed(0)
    n = torch.randn(64, 64, device=dev).cpu()
    assert n.dtype == torch.float32 and abs(n.mean().item()) < 0.1 and abs(n.std().item() - 1) < 0.1
    u = torch.rand(1000, device=dev).cpu()
    assert 0 <= u.min().item() and u.max().item() < 1
    r = torch.randint(2, 5, (1000,), device=dev).cpu()
    assert r.dtype == torch.int64 and set(r.tolist()) == {2, 3, 4}
    e = torch.empty(3, 2, device=dev)
    assert e.shape == (3, 2) and e.dtype == torch.float32


def test_manual_seed_reproducible(dev):
    xla_dtensor.manual_seed(7)
    a = torch.randn(5, device=dev).cpu()
    xla_dtensor.manual_seed(7)
    b = torch.randn(5, device=dev).cpu()
    assert torch.equal(a, b) and not torch.equal(a, torch.randn(5, device=dev).cpu())


def test_to_cpu_item_tolist_numpy_print(dev):
    c = torch.tensor([[1.5, -2.0], [3.0, 4.25]])
    t = c.to(dev)
    assert torch.equal(t.cpu(), c) and torch.equal(t.to("cpu"), c)
    assert t.sum().item() == c.sum().item()
    assert t.tolist() == c.tolist()
    np.testing.assert_array_equal(t.numpy(), c.numpy())
    assert repr(t) == repr(c)[:-1] + ", device='jax:0')"
    assert str(torch.tensor([1, 2], device=dev)) == "tensor([1, 2], device='jax:0')"
    assert torch.tensor(3.0, device=dev).item() == 3.0
    assert t.to(torch.float64).dtype == torch.float64
    with pytest.raises(RuntimeError, match="requires grad"):
        t.requires_grad_().numpy()


@pytest.mark.parametrize("make", [
    lambda d: torch.tensor([], dtype=torch.float32, device=d),  # transformers' DynamicCache starts so
    lambda d: torch.zeros(2, 0, 3, dtype=torch.bfloat16).to(d),
    lambda d: torch.zeros(4, 0, dtype=torch.int64).t().to(d),
])
def test_an_empty_host_tensor_is_made_on_the_device_without_a_transfer(dev, make):
    sent = xla_dtensor.metrics.counters()["transfers_to_device"]
    got, want = make(dev), make("cpu")
    assert xla_dtensor.metrics.counters()["transfers_to_device"] == sent
    assert (got.shape, got.dtype, got.stride()) == (want.shape, want.dtype, torch.empty(want.shape).stride())
    k = torch.randn(2, 4, 3, 8)
    if want.dim() == 1:  # torch.cat skips a 1-D empty tensor, as the cache's first update relies on
        torch.testing.assert_close(torch.cat([got, k.to(dev)], dim=-2).cpu(), torch.cat([want, k], dim=-2))
    torch.testing.assert_close((got + 1).cpu(), want + 1)
    assert torch.equal(got.cpu(), want)


def test_module_to_device_keeps_parameter_identity(dev):
    m = torch.nn.Linear(3, 2)
    w = m.weight
    m.to(dev)
    assert m.weight is w and m.weight.device.type == "jax" and isinstance(m.weight, torch.nn.Parameter)
    x = torch.randn(4, 3)
    torch.testing.assert_close(m(x.to(dev)).cpu(), torch.nn.functional.linear(x, w.cpu(), m.bias.cpu()))


def test_mixing_cpu_and_device_tensors_raises_torch_error(dev):
    with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device=dev) + torch.ones(3)


def test_cpu_scalar_tensor_mixes_like_torch(dev):
    got = torch.ones(3, device=dev) * torch.tensor(2.5)
    torch.testing.assert_close(got.cpu(), torch.ones(3) * torch.tensor(2.5))


def test_unsupported_dtype_raises(dev):
    with pytest.raises(TypeError, match="not supported on the jax device"):
        torch.zeros(2, dtype=torch.complex32, device=dev)


def test_shape_error_raised_at_op_with_torch_message(dev):
    with pytest.raises(RuntimeError) as cpu_err:
        torch.ones(2, 3) @ torch.ones(2, 3)
    with pytest.raises(RuntimeError) as dev_err:
        torch.ones(2, 3, device=dev) @ torch.ones(2, 3, device=dev)
    assert str(dev_err.value) == str(cpu_err.value)


def test_missing_lowering_names_op_and_shapes_then_cpu_fallback_counts(dev, monkeypatch):
    from xla_dtensor.core import entries
    from xla_dtensor.ops import registry
    op = torch.ops.aten.neg.default
    monkeypatch.setitem(registry._LOWERINGS, op, None)
    monkeypatch.setattr(entries, "_decomposed", lambda *a: None)
    x = torch.arange(3.0, device=dev) + 10  # a fresh signature: (3,) float32 plus this test's shapes
    with pytest.raises(NotImplementedError, match=r"aten.neg.default.*float32\[3\]"):
        torch.neg(x)
    monkeypatch.setattr(xla_dtensor.config, "cpu_fallback", True)
    before = xla_dtensor.metrics.snapshot()
    y = torch.neg(x.view(3, 1))
    assert xla_dtensor.metrics.diff(before)["cpu_fallbacks"] == 1
    torch.testing.assert_close(y.cpu(), -(torch.arange(3.0) + 10).view(3, 1))


def test_second_registration_of_privateuse1_is_clear_error(monkeypatch):
    d = sys.modules["xla_dtensor.core.device"]
    monkeypatch.setattr(d, "_registered", False)
    monkeypatch.setattr(torch._C, "_get_privateuse1_backend_name", lambda: "otherlib")
    with pytest.raises(DeviceRegistrationError, match="'otherlib'"):
        register()


def test_config_rejects_unknown_options():
    with pytest.raises(AttributeError, match="cpu_fallback"):
        xla_dtensor.config.cpu_falback = True
    with pytest.raises(ValueError, match="positive"):
        xla_dtensor.config.cache_size = 0


def test_clean_interpreter_exit():
    code = ("import xla_dtensor, torch; d = xla_dtensor.device(); m = torch.nn.Linear(4, 2).to(d); "
            "l = m(torch.ones(3, 4, device=d)).sum(); l.backward(); xla_dtensor.sync(); print(l.item())")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]


def test_device_guard_answers_its_type_without_a_python_frame():
    """torch asks the PrivateUse1 guard its type ~4 times per backward op: ours answers from C
    (itertools), with torch's answer, where torch's default guard runs a Python method."""
    import inspect
    import sys

    import torch.utils.backend_registration as br
    guard = sys.modules["xla_dtensor.core.device"]._DeviceGuard()
    assert guard.type_() == br._DummyDeviceGuard().type_() == torch._C._autograd.DeviceType.PrivateUse1
    assert not inspect.isfunction(guard.type_) and not inspect.ismethod(guard.type_)


_GUARD_PROBE = """
import torch, xla_dtensor
from xla_dtensor.core import cxx
s = torch.Stream(device="jax")
e = torch.Event(device="jax")
e.record(s)
x = torch.ones(3, device="jax", requires_grad=True)
(x * x).sum().backward()
print(cxx.MODULE is not None and cxx.MODULE.device_guard_is_ours(), repr(s), s.query(), e.query(),
      x.grad.device, x.grad.cpu().tolist())
"""


def test_cxx_device_guard_answers_as_torchs_python_guard():
    """The C++ guard (torch asks it for each output's stream and each backward op's device) gives what
    torch's Python-backend guard gives: the same stream, events, device and gradients."""
    import os
    runs = {}
    for cxx_on in ("1", "0"):
        env = {**os.environ, "XLA_DTENSOR_CXX": cxx_on}
        r = subprocess.run([sys.executable, "-c", _GUARD_PROBE], capture_output=True, text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        runs[cxx_on] = r.stdout.strip().split(" ", 1)
    from xla_dtensor.core import cxx
    assert runs["1"][0] == str(cxx.MODULE is not None) and runs["0"][0] == "False"
    assert runs["1"][1] == runs["0"][1]
    assert "stream_id=0" in runs["0"][1] and "[2.0, 2.0, 2.0]" in runs["0"][1]
