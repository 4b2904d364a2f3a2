"""LR schedules under ``xla_dtensor.compile``: hyperparameters are program inputs.

Each scheduler x float / CPU-tensor / device-tensor lr x one device / 2x4 FSDP: 40 compiled
steps equal torch CPU (rel 1e-4) with at most 2 compiles after step 5. The default run takes every
scheduler and lr kind on 2x4 FSDP and, on one device, every lr kind of one SGD and one AdamW
schedule; ``-m slow`` the other one-device cases (~12 s: the same replay on fewer devices).
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.optim import lr_scheduler as S

import xla_dtensor
from mesh import Mesh
from xla_dtensor import metrics
from xla_dtensor.fsdp import shard_model

STEPS = 40


def _sgd(params, lr):
    return torch.optim.SGD(params, lr=lr, momentum=0.9, weight_decay=0.01, nesterov=True)


def _adamw(params, lr):
    return torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.99), weight_decay=0.05)


# name -> (optimizer, scheduler factory): momentum cycled for SGD and beta1 for AdamW by OneCycleLR
SCHEDULES = {
    "lambda": (_sgd, lambda o: S.LambdaLR(o, lambda s: 1.0 / (1 + 0.3 * s))),
    "step": (_sgd, lambda o: S.StepLR(o, step_size=7, gamma=0.5)),
    "cosine": (_adamw, lambda o: S.CosineAnnealingLR(o, T_max=STEPS, eta_min=1e-4)),
    "onecycle_sgd": (_sgd, lambda o: S.OneCycleLR(o, max_lr=0.05, total_steps=STEPS)),
    "onecycle_adamw": (_adamw, lambda o: S.OneCycleLR(o, max_lr=0.02, total_steps=STEPS)),
    "warmup_cosine": (_adamw, lambda o: S.SequentialLR(o, [S.LinearLR(o, start_factor=0.1, total_iters=5),
                                                           S.CosineAnnealingLR(o, T_max=STEPS - 5)], milestones=[5])),
}
KINDS = ("float", "cpu", "device")
MESHES = ("1", "2x4")
ONE_DEVICE = ("lambda", "cosine")  # the schedules whose one-device cases are in the default run
CASES = [pytest.param(s, k, m, marks=[pytest.mark.slow] if m == "1" and s not in ONE_DEVICE else [])
         for s in SCHEDULES for k in KINDS for m in MESHES]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8))


@pytest.fixture(scope="module")
def data() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(8, 8, generator=g), torch.randn(8, 8, generator=g)) for _ in range(STEPS)]


def _lr(kind: str, dev: torch.device | None) -> float | torch.Tensor:
    if kind == "float":
        return 0.02
    return torch.tensor(0.02, device=dev if kind == "device" else "cpu")


def _step(model, opt, x, y):
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _cpu_losses(name: str, kind: str, data: list) -> list[float]:
    make_opt, make_sched = SCHEDULES[name]
    model = _model()
    opt = make_opt(model.parameters(), _lr("cpu" if kind != "float" else "float", None))
    sched = make_sched(opt)
    out = []
    for x, y in data:
        out.append(_step(model, opt, x, y).item())
        sched.step()
    return out


@pytest.mark.parametrize("name,kind,layout", CASES)
def test_schedule_replays_this_steps_values_without_recompiling(dev, data, name, kind, layout):
    make_opt, make_sched = SCHEDULES[name]
    model = _model()
    if layout == "2x4":
        shard_model(model, Mesh(range(8), (2, 4), ("dp", "fsdp")), axis="fsdp")
    else:
        model.to(dev)
    opt = make_opt(model.parameters(), _lr(kind, dev))
    sched = make_sched(opt)
    step = xla_dtensor.compile(_step)
    got, before = [], None
    for i, (x, y) in enumerate(data):
        if i == 6:  # after step 5 (0-based): SequentialLR's switch at step 5 resets a tensor lr once
            before = metrics.snapshot()
        got.append(step(model, opt, x.to(dev), y.to(dev)))
        sched.step()
    got = [t.item() for t in got]
    d = metrics.diff(before)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(_cpu_losses(name, kind, data)), rtol=1e-4, atol=0)
    assert d["compiles"] <= 2, d
    assert d["compile_replays"] >= STEPS - 6 - 3, d
    if kind == "cpu":
        assert isinstance(opt.param_groups[0]["lr"], torch.Tensor) and opt.param_groups[0]["lr"].device.type == "cpu"


def test_hyperparameter_signature_holds_kinds_not_values():
    from xla_dtensor.jit.args import signature
    p = torch.zeros(2, requires_grad=True)
    opt = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    a = signature((opt,), {}, [])
    opt.param_groups[0]["lr"] = 0.2
    assert signature((opt,), {}, []) == a
    assert signature((opt,), {}, [], static=True) != a
    opt.param_groups[0]["nesterov"] = True
    assert signature((opt,), {}, []) != a


def test_a_hyperparameter_baked_into_a_tensor_keeps_values_in_the_signature(dev):
    """An lr that reaches the program other than as a scalar argument (here: a tensor built
    from it) cannot be an input: the function warns once and retraces per value, still right."""
    w = torch.ones(4, device=dev)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)

    @xla_dtensor.compile
    def f(opt, w):
        w.mul_(torch.tensor([opt.param_groups[0]["lr"]] * 4, device=w.device))
        return w.sum()

    with pytest.warns(xla_dtensor.jit.HyperparameterWarning):
        assert f(opt, w).item() == pytest.approx(2.0)
    opt.param_groups[0]["lr"] = 0.25
    assert f(opt, w).item() == pytest.approx(0.5)
    assert f(opt, w).item() == pytest.approx(0.125)


def test_a_hyperparameter_as_a_fill_value_is_an_input(dev):
    w = torch.ones(4, device=dev)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5)

    @xla_dtensor.compile
    def f(opt, w):
        w.mul_(torch.full((4,), opt.param_groups[0]["lr"], device=w.device))
        return w.sum()

    before = metrics.snapshot()
    for i, lr in enumerate((0.5, 0.25, 2.0, 4.0, 0.5)):
        opt.param_groups[0]["lr"] = lr
        assert f(opt, w).item() == pytest.approx(4 * [0.5, 0.125, 0.25, 1.0, 0.5][i])
    d = metrics.diff(before)
    assert d["compiles"] <= 1 and d["compile_replays"] >= 3, d


def test_a_comparison_on_a_hyperparameter_is_a_guard(dev):
    w = torch.ones(4, device=dev)
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.5, momentum=0.9)

    @xla_dtensor.compile
    def f(opt, w):
        g = opt.param_groups[0]
        if g["lr"] > 0.3:
            w.add_(1.0, alpha=g["lr"])
        else:
            w.sub_(1.0, alpha=g["momentum"] * g["lr"])
        return w.sum()

    ref, got = torch.ones(4), []
    for lr in (0.5, 0.4, 0.45, 0.2, 0.1, 0.35, 0.2):
        opt.param_groups[0]["lr"] = lr
        ref = ref + lr if lr > 0.3 else ref - 0.9 * lr
        got.append((f(opt, w).item(), ref.sum().item()))
    for a, b in got:
        assert a == pytest.approx(b, rel=1e-6)
