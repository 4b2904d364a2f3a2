"""Fused optimizers (``fused=True``) on the jax device vs torch CPU's own fused kernels."""
from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch

import xla_dtensor

DEV = xla_dtensor.device()
# each config traces its own few programs from the same call sites: expected, not a recompile problem
pytestmark = pytest.mark.filterwarnings("ignore::xla_dtensor.debug.analysis.RecompileWarning")
CONFIGS: list[tuple[str, Callable[..., torch.optim.Optimizer], dict]] = [
    ("adamw", torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}),
    ("adamw-amsgrad-max", torch.optim.AdamW, {"lr": 1e-2, "amsgrad": True, "maximize": True}),
    ("adam-wd", torch.optim.Adam, {"lr": 1e-2, "weight_decay": 0.05, "betas": (0.8, 0.9)}),
    ("adam-tensor-lr", torch.optim.Adam, {"lr": torch.tensor(3e-3)}),
    ("sgd", torch.optim.SGD, {"lr": 0.1}),
    ("sgd-nesterov", torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("sgd-dampening-max", torch.optim.SGD, {"lr": 0.05, "momentum": 0.5, "dampening": 0.3, "maximize": True}),
    ("adagrad", torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.02}),
]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _train(model: torch.nn.Module, make: Callable[..., torch.optim.Optimizer], kw: dict, dev: Any,
           steps: int = 4) -> list[float]:
    kw = {k: (v.to(dev) if isinstance(v, torch.Tensor) and dev != "cpu" else v) for k, v in kw.items()}
    opt = make(model.parameters(), fused=True, **kw)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(4, 6, generator=gen).to(dev)
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss.item()))
    return losses


@pytest.mark.parametrize("name,make,kw", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_fused_optimizer_matches_cpu(name: str, make: Callable[..., torch.optim.Optimizer], kw: dict) -> None:
    ref = _model()
    ours = copy.deepcopy(ref).to(DEV)
    ref_losses = _train(ref, make, kw, "cpu")
    losses = _train(ours, make, kw, DEV)
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for p, q in zip(ours.parameters(), ref.parameters()):
        torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def _lists(n: int, gen: torch.Generator, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.randn(3, 2, generator=gen).to(dtype) for _ in range(n)]


@pytest.mark.parametrize("found", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_adamw_grad_scale_and_found_inf(found: float, dtype: torch.dtype) -> None:
    """Direct op call: gradients divided by grad_scale (and written back); found_inf == 1 skips the update."""
    gen = torch.Generator().manual_seed(2)
    params, grads, m = _lists(2, gen, dtype), _lists(2, gen, dtype), _lists(2, gen, dtype)
    v = [t.abs() for t in _lists(2, gen, dtype)]
    vmax = [t.abs() + 0.5 for t in _lists(2, gen, dtype)]
    steps = [torch.tensor(3.0), torch.tensor(3.0)]
    kw = dict(lr=1e-2, beta1=0.9, beta2=0.99, weight_decay=0.1, eps=1e-8, amsgrad=True, maximize=False)
    scale, inf = torch.tensor(4.0), torch.tensor(found)
    ref = [[t.clone() for t in g] for g in (params, grads, m, v, vmax)]
    torch._fused_adamw_(*ref, steps, grad_scale=scale, found_inf=inf, **kw)
    ours = [[t.to(DEV) for t in g] for g in (params, grads, m, v, vmax)]
    torch._fused_adamw_(*ours, [s.to(DEV) for s in steps], grad_scale=scale.to(DEV), found_inf=inf.to(DEV), **kw)
    for group, (got, want) in enumerate(zip(ours, ref)):
        for a, b in zip(got, want):
            torch.testing.assert_close(a.cpu(), b, msg=lambda s, group=group: f"group {group}: {s}")
    if found:
        for a, b in zip(ours[0], params):
            assert torch.equal(a.cpu(), b)


def test_fused_adamw_in_eager_and_compile_match_cpu() -> None:
    """One op per step in eager mode; compile(train_step) replays it; both track CPU's fused AdamW."""
    ref = _model()
    ref_losses = _train(ref, torch.optim.AdamW, {"lr": 1e-2}, "cpu", steps=5)
    eager_model = copy.deepcopy(_model()).to(DEV)
    xla_dtensor.eager_mode(True)
    try:
        eager_losses = _train(eager_model, torch.optim.AdamW, {"lr": 1e-2}, DEV, steps=5)
        opt = torch.optim.AdamW(eager_model.parameters(), lr=1e-2, fused=True)
        eager_model(torch.ones(1, 6, device=DEV)).sum().backward()
        opt.step()  # creates the state
        before = xla_dtensor.metrics.snapshot()
        opt.step()
        ops = xla_dtensor.metrics.diff(before)["eager_ops"]
    finally:
        xla_dtensor.eager_mode(False)
    assert eager_losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert ops == 2  # torch's fused path: _foreach_add_ on the step counters, then _fused_adamw_

    model = _model().to(DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=True)

    @xla_dtensor.compile
    def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
        loss = model(x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    gen = torch.Generator().manual_seed(1)
    before = xla_dtensor.metrics.snapshot()
    losses = [float(step(model, opt, torch.randn(4, 6, generator=gen).to(DEV)).item()) for _ in range(5)]
    counts = xla_dtensor.metrics.diff(before)
    assert losses == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    assert counts["compile_replays"] == 3  # traced with no state, then with state, then replayed



def test_unscaled_gradients_are_not_rewritten() -> None:
    """Without grad_scale the op leaves the gradients alone: no write-back, even though the schema marks them."""
    gen = torch.Generator().manual_seed(3)
    params, grads, bufs = ([t.to(DEV) for t in _lists(2, gen)] for _ in range(3))
    before = [g._storage.value for g in grads]
    torch._fused_sgd_(params, grads, bufs, weight_decay=0.0, momentum=0.9, lr=0.1, dampening=0.0,
                      nesterov=False, maximize=False, is_first_step=False)
    assert all(g._storage.value is v for g, v in zip(grads, before))
    assert all(p._storage.value.fn is not None for p in params)  # the parameters were written
    copied = [t.to(DEV) for t in _lists(2, gen)]
    torch._foreach_copy_(copied, params)  # a target set to another input is a real write
    torch.testing.assert_close([c.cpu() for c in copied], [p.cpu() for p in params])


def test_unscaled_bf16_gradients_are_not_rewritten_either() -> None:
    gen = torch.Generator().manual_seed(4)
    params, grads, m, v = ([t.to(DEV) for t in _lists(2, gen, torch.bfloat16)] for _ in range(4))
    before = [g._storage.value for g in grads]
    torch._fused_adam_(params, grads, m, v, [], [torch.tensor(1.0).to(DEV)] * 2, lr=1e-2, beta1=0.9,
                       beta2=0.99, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=True)
    assert all(g._storage.value is b for g, b in zip(grads, before))
