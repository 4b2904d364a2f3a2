"""The basic tensor protocol and torch.compile on jax tensors (oracle: torch CPU eager)."""
from __future__ import annotations

import copy
import io
import pickle
import warnings

import pytest
import torch

import xla_dtensor
import xla_dtensor.dynamo_backend  # noqa: F401  (registers backend="xla_dtensor" in a source checkout)
from xla_dtensor import dynamo_route
from xla_dtensor.compat.torch_xla.distributed import spmd as xs


def test_equal_allclose_isclose(dev):
    a_cpu = torch.arange(6.).reshape(2, 3)
    a, b = a_cpu.to(dev), a_cpu.clone().to(dev)
    assert torch.equal(a, b) and not torch.equal(a, b + 1) and not torch.equal(a, a[:1])
    for other, kw in [(a_cpu + 1e-7, {}), (a_cpu + 1e-2, {}), (a_cpu + 1e-2, {"atol": 0.1})]:
        assert torch.allclose(a, other.to(dev), **kw) == torch.allclose(a_cpu, other, **kw)
    nan = torch.tensor([float("nan"), 1.0])
    assert torch.equal(nan.to(dev), nan.to(dev)) == torch.equal(nan, nan)
    assert torch.allclose(nan.to(dev), nan.to(dev), equal_nan=True)
    assert torch.equal(torch.isclose(a, b + 1e-3, atol=1e-2).cpu(), torch.isclose(a_cpu, a_cpu + 1e-3, atol=1e-2))


def test_deepcopy_and_pickle(dev):
    m = xs.Mesh(range(8), (2, 4), ("x", "y"))
    t = torch.arange(8.).reshape(2, 4).to(dev)
    xs.mark_sharding(t, m, ("x", "y"))
    c = copy.deepcopy(t)
    assert c.device == t.device and torch.equal(c.cpu(), t.cpu()) and c._storage is not t._storage
    lin = torch.nn.Linear(3, 2).to(dev)
    ema = copy.deepcopy(lin)
    assert isinstance(ema.weight, torch.nn.Parameter) and ema.weight.device.type == "jax"
    assert torch.equal(ema.weight.cpu(), lin.weight.cpu())
    with torch.no_grad():
        ema.weight.mul_(0)
    assert lin.weight.abs().sum().item() > 0
    back = pickle.loads(pickle.dumps(t))
    assert back.device.type == "jax" and torch.equal(back.cpu(), torch.arange(8.).reshape(2, 4))
    buf = io.BytesIO()
    torch.save(t.cpu(), buf); buf.seek(0)
    assert torch.equal(torch.load(buf), t.cpu())


@pytest.fixture(scope="module")
def models(dev):
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    return ref, copy.deepcopy(ref).to(dev)


def test_compile_ours_forward_backward_matches_cpu(models, dev):
    ref, model = models
    x = torch.randn(8, 4)
    out = torch.compile(model, backend="xla_dtensor")(x.to(dev))
    assert out.device.type == "jax" and torch.allclose(out.cpu(), ref(x), atol=1e-5)
    out.pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert torch.allclose(model[0].weight.grad.cpu(), ref[0].weight.grad, atol=1e-5)
    model.zero_grad(); ref.zero_grad()


def test_compile_sharded_inputs_keep_layout(models, dev):
    ref, model = models
    m = xs.Mesh(range(8), (2, 4), ("x", "y"))
    x = torch.randn(8, 4)
    xd = x.to(dev)
    xs.mark_sharding(xd, m, (("x", "y"), None))
    out = torch.compile(model, backend="xla_dtensor")(xd)
    assert torch.allclose(out.cpu(), ref(x), atol=1e-5)
    assert xs.get_sharding_spec(out) == "{devices=[8,1]<=[8]}"
    with pytest.raises(Exception, match="global_tensor"):
        torch.compile(lambda t: t * 2, backend="xla_dtensor")(xs.mark_sharding(torch.ones(8).to(dev), m, ("y",)))


def test_default_backend_routes_or_raises(dev):
    f = torch.compile(lambda t: torch.sin(t) * 2)
    x = torch.linspace(0, 1, 5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dynamo_route.RoutedToXlaDtensorWarning)
        assert torch.allclose(f(x.to(dev)).cpu(), torch.sin(x) * 2, atol=1e-6)
    dynamo_route.set_routing(False)
    try:
        with pytest.raises(Exception, match="backend='xla_dtensor'"):
            torch.compile(lambda t: t + 1)(x.to(dev))
    finally:
        dynamo_route.set_routing(True)
