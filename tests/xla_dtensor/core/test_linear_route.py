"""``F.linear`` on the jax device records one op (core.linear), against torch CPU: outputs and every
gradient, half types, double backward, the cases left to torch's decomposition with torch's own
errors, and trained sharded (DP, 2x4 Megatron via mark_sharding, FSDP, AUTO) and on transformers' Llama."""
from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.config import config

from tests._train import MLP_BATCHES, sharded_mlp_like_cpu


def _fused() -> int:
    return metrics.counters()["fused_linear"]


@pytest.mark.parametrize("shape,bias,dtype", [((2, 3, 8), True, torch.float32), ((6, 8), False, torch.float32),
                                              ((2, 2, 3, 8), True, torch.bfloat16)])
def test_one_op_with_torch_cpu_values_and_gradients(dev, shape, bias, dtype):
    torch.manual_seed(0)
    x, w = torch.randn(shape, dtype=dtype), torch.randn(5, 8, dtype=dtype)
    b = torch.randn(5, dtype=dtype) if bias else None
    cpu = [t.clone().requires_grad_() for t in (x, w, b) if t is not None]
    lazy = [t.to(dev).requires_grad_() for t in (x, w, b) if t is not None]
    before, ops0 = _fused(), metrics.counters()["ops_recorded"]
    y = F.linear(*lazy)
    assert _fused() == before + 1 and metrics.counters()["ops_recorded"] == ops0 + 1
    want = F.linear(*cpu)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    assert y.dtype == want.dtype and y.shape == want.shape
    torch.testing.assert_close(y.cpu(), want.detach(), **tol)
    (want.float() ** 2).sum().backward()
    back0 = metrics.counters()["fused_linear_backward"]
    (y.float() ** 2).sum().backward()
    assert metrics.counters()["fused_linear_backward"] == back0 + 1  # the gradients: one op
    for c, lz in zip(cpu, lazy):
        torch.testing.assert_close(lz.grad.cpu(), c.grad, **tol)


@pytest.mark.parametrize("needs", ["weight", "input"])
def test_gradients_of_some_inputs_take_torch_ops(dev, needs):
    """Only the weight (frozen input) or only the input (frozen layer) needs a gradient: torch's
    formula in torch ops, not the three-gradient op."""
    torch.manual_seed(1)
    x, w, b = torch.randn(2, 3, 8), torch.randn(5, 8), torch.randn(5)
    grads = {}
    for d in ("cpu", dev):
        xs_, ws_, bs_ = (t.to(d).detach() for t in (x, w, b))
        leaf = ws_ if needs == "weight" else xs_
        leaf.requires_grad_()
        back0 = metrics.counters()["fused_linear_backward"]
        F.linear(xs_, ws_, bs_).square().sum().backward()
        assert metrics.counters()["fused_linear_backward"] == back0
        grads[str(d)] = leaf.grad.cpu()
    torch.testing.assert_close(grads[str(dev)], grads["cpu"])


def test_double_backward_and_no_grad(dev):
    x, w = torch.randn(4, 3, requires_grad=True), torch.randn(2, 3, requires_grad=True)
    xl, wl = x.detach().to(dev).requires_grad_(), w.detach().to(dev).requires_grad_()
    outs = []
    for a, m in ((x, w), (xl, wl)):
        (g,) = torch.autograd.grad(F.linear(a, m).tanh().sum(), a, create_graph=True)
        g.square().sum().backward()  # the gradient's gradient reaches the weight
        outs.append((g, m.grad))
    for got, want in zip(outs[1], outs[0]):
        torch.testing.assert_close(got.cpu(), want.detach())
    with torch.no_grad():
        y = F.linear(xl, wl)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y.cpu(), F.linear(x, w).detach())


def test_other_calls_take_torch_decomposition_and_its_errors(dev, monkeypatch):
    w = torch.randn(5, 8)
    before = _fused()
    torch.testing.assert_close(F.linear(torch.ones(8).to(dev), w.to(dev)).cpu(), F.linear(torch.ones(8), w))
    for x, wt, b in ((torch.ones(2, 7), w, None), (torch.ones(2, 8), w, torch.ones(4))):
        with pytest.raises(RuntimeError) as cpu_error:
            F.linear(x, wt, b)
        with pytest.raises(RuntimeError, match=re.escape(str(cpu_error.value).splitlines()[0])):
            F.linear(x.to(dev), wt.to(dev), None if b is None else b.to(dev))
    monkeypatch.setattr(config, "fused_linear", False)
    torch.testing.assert_close(F.linear(torch.ones(2, 3, 8).to(dev), w.to(dev)).cpu(), F.linear(torch.ones(2, 3, 8), w))
    assert _fused() == before
    with pytest.raises(ValueError, match="fused_linear must be True or False, got 'yes'"):
        config.fused_linear = "yes"


@pytest.mark.parametrize("mode", ["dp", "megatron", "fsdp", "auto"])
def test_sharded_training_matches_cpu_through_the_one_op(dev, mode):
    model, fused = sharded_mlp_like_cpu(mode, dev, _fused)
    assert fused == 2 * len(MLP_BATCHES)
    if mode == "auto":  # AUTO planned both ops with their rules (autoshard/strategies/matmul.py)
        assert model._auto_plan.stats["unknown_ops"] == []


@pytest.mark.parametrize("mode", ["single", "tp"])
def test_transformers_llama_records_its_projections_as_one_op(mode):
    """transformers' Llama (every projection an nn.Linear) against torch CPU, through the models matrix's
    own training loop, on one device and 2x4 Megatron; each of its 7 projections and the LM head is one op
    per forward. (AUTO plans the op with its own rules: the MLP above; AUTO trains transformers' Llama,
    through this op, in tests/xla_dtensor/auto/test_hf_auto.py.)"""
    from benchmarks.models.zoo import ZOO
    from benchmarks.models.zoo_train import train as zoo_train
    before = _fused()
    res = zoo_train(ZOO["hf-llama"], mode, 3)
    assert _fused() - before == 3 * 8
    torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(zoo_train(ZOO["hf-llama"], "cpu", 3).losses),
                               rtol=1e-3, atol=0)
