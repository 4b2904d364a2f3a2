"""torch's Adam/AdamW/SGD over lazy parameters take their fused implementation by default
(``xla_dtensor/core/fused_optim.py``): results against torch CPU's own default (the per-parameter
loop), the cases left alone, sharded training (DP, 2x4 Megatron, FSDP, AUTO) and transformers' Llama."""
from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from xla_dtensor.config import config
from tests._train import sharded_mlp, train

# each case traces its own few programs from the same call sites: expected, not a recompile problem
pytestmark = pytest.mark.filterwarnings("ignore::xla_dtensor.debug.analysis.RecompileWarning")
FUSED_OPS = ("_fused_adam_", "_fused_adamw_", "_fused_sgd_")


@pytest.fixture
def fused_calls(monkeypatch) -> list[str]:
    """The names of torch's fused optimizer ops called while the test runs."""
    calls: list[str] = []
    for name in FUSED_OPS:
        real = getattr(torch, name)

        def spy(*args: Any, _real: Callable = real, _name: str = name, **kwargs: Any) -> Any:
            calls.append(_name)
            return _real(*args, **kwargs)
        monkeypatch.setattr(torch, name, spy)
    return calls


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


BATCHES = [(torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(s)),
            torch.randn(8, 4, 8, generator=torch.Generator().manual_seed(s + 50))) for s in range(3)]
OPTIMIZERS: dict[str, tuple[type, dict, str]] = {
    "adamw": (torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}, "_fused_adamw_"),
    "adam-amsgrad": (torch.optim.Adam, {"lr": 1e-2, "amsgrad": True}, "_fused_adam_"),
    "sgd-momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}, "_fused_sgd_"),
}


def _run(model: torch.nn.Module, opt: torch.optim.Optimizer, put: Any = None) -> list[float]:
    sync = None if put is None else xla_dtensor.sync
    return train(lambda x, y: F.mse_loss(model(x), y), BATCHES, opt, put=put, sync=sync)


def _cpu(make: type, kw: dict) -> tuple[list[float], list[torch.Tensor]]:
    ref = _mlp()
    losses = _run(ref, make(ref.parameters(), **kw))
    return losses, [p.detach() for p in ref.parameters()]


def _check(got: list[float], model: torch.nn.Module, want: tuple[list[float], list[torch.Tensor]]) -> None:
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want[0]), rtol=1e-4, atol=1e-6)
    for p, q in zip(model.parameters(), want[1]):
        torch.testing.assert_close(p.detach().cpu(), q, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_default_optimizer_steps_fused_with_torch_cpu_results(dev, name, fused_calls):
    make, kw, op = OPTIMIZERS[name]
    model = _mlp().to(dev)
    opt = make(model.parameters(), **kw)
    assert opt.param_groups[0]["fused"] is None
    got = _run(model, opt, put=lambda t: t.to(dev))
    assert opt.param_groups[0]["fused"] is True and opt._step_supports_amp_scaling
    assert fused_calls == [op] * len(BATCHES)
    _check(got, model, _cpu(make, kw))
    if name != "sgd-momentum":  # torch keeps a fused optimizer's step counter on the parameter's device
        assert all(st["step"].device == dev for st in opt.state.values())


def _adamw_subclass(params: Any, **kw: Any) -> torch.optim.Optimizer:
    class MyAdamW(torch.optim.AdamW):
        pass
    return MyAdamW(params, **kw)


LEFT_ALONE: dict[str, tuple[Callable[..., torch.optim.Optimizer], dict, Any]] = {
    "foreach-false": (torch.optim.AdamW, {"foreach": False}, None),
    "foreach-true": (torch.optim.AdamW, {"foreach": True}, None),
    "fused-false": (torch.optim.AdamW, {"fused": False}, False),
    "subclass": (_adamw_subclass, {}, None),
    "config-off": (torch.optim.AdamW, {}, None),
}


@pytest.mark.parametrize("case", list(LEFT_ALONE))
def test_what_the_user_chose_is_left_alone(dev, case, fused_calls, monkeypatch):
    make, kw, fused = LEFT_ALONE[case]
    if case == "config-off":
        monkeypatch.setattr(config, "fused_optimizers", False)
    kw = {"lr": 1e-2, **kw}
    model = _mlp().to(dev)
    opt = make(model.parameters(), **kw)
    got = _run(model, opt, put=lambda t: t.to(dev))
    assert fused_calls == [] and opt.param_groups[0]["fused"] is fused
    _check(got, model, _cpu(make, kw))


def test_a_differentiable_optimizer_is_left_alone(dev):
    """(Its step runs under autograd, which a plain training loop's leaf parameters refuse: the hook alone.)"""
    from xla_dtensor.core.fused_optim import prefer_fused
    opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(3, device=dev))], lr=0.1, differentiable=True)
    prefer_fused(opt, (), {})
    assert opt.param_groups[0]["fused"] is None


def test_state_loaded_from_a_cpu_run_keeps_its_implementation(dev, fused_calls):
    """A checkpoint of torch CPU's default AdamW (step counters on the host) resumes as it was made."""
    ref = _mlp()
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    _run(ref, ref_opt)
    model = copy.deepcopy(ref).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    opt.load_state_dict(copy.deepcopy(ref_opt.state_dict()))  # (torch shares host step counters otherwise)
    got = _run(model, opt, put=lambda t: t.to(dev))
    want = _run(ref, ref_opt)
    assert fused_calls == [] and opt.param_groups[0]["fused"] is None
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)


def test_a_group_added_later_is_switched_too(dev, fused_calls):
    first, second = torch.nn.Linear(4, 4).to(dev), torch.nn.Linear(4, 4).to(dev)
    opt = torch.optim.AdamW(first.parameters(), lr=1e-2)
    first(torch.ones(2, 4, device=dev)).sum().backward()
    opt.step()
    opt.add_param_group({"params": list(second.parameters())})
    (first(torch.ones(2, 4, device=dev)) + second(torch.ones(2, 4, device=dev))).sum().backward()
    opt.step()
    assert [g["fused"] for g in opt.param_groups] == [True, True]
    assert fused_calls == ["_fused_adamw_"] * 3  # one group, then one call per group


def test_config_rejects_a_non_bool():
    with pytest.raises(ValueError, match="fused_optimizers must be True or False, got 1"):
        config.fused_optimizers = 1


@pytest.mark.parametrize("mode", ["dp", "megatron", "fsdp", "auto"])
def test_sharded_training_steps_fused_with_torch_cpu_results(dev, mode, fused_calls):
    model, put = sharded_mlp(mode, _mlp(), dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    got = _run(model, opt, put=put)
    assert fused_calls == ["_fused_adamw_"] * len(BATCHES)
    _check(got, model, _cpu(torch.optim.AdamW, {"lr": 1e-2, "weight_decay": 0.1}))


def test_transformers_llama_fsdp_steps_fused(fused_calls):
    """transformers' Llama through the models matrix's own loop (AdamW, no flags), FSDP over 8 devices,
    against the same loop on torch CPU."""
    from benchmarks.models.zoo import ZOO
    from benchmarks.models.zoo_train import train as zoo_train
    res = zoo_train(ZOO["hf-llama"], "fsdp", 3)
    assert fused_calls == ["_fused_adamw_"] * 3
    torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(zoo_train(ZOO["hf-llama"], "cpu", 3).losses),
                               rtol=1e-3, atol=0)


@pytest.mark.parametrize("name", ["adamw", "sgd-momentum"])
def test_a_learning_rate_schedule_reuses_the_program(dev, name, fused_calls):
    """The fused ops' float hyperparameters are program inputs: a new learning rate each step compiles
    nothing after the first steps, and the values follow torch CPU's schedule."""
    from xla_dtensor import metrics
    make, kw, op = OPTIMIZERS[name]

    def run(model: torch.nn.Module, put: Any) -> tuple[list[float], list[int]]:
        opt = make(model.parameters(), **kw)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
        losses, compiles = [], []
        for i in range(5):
            x, y = BATCHES[i % len(BATCHES)]
            loss = F.mse_loss(model(put(x)), put(y))
            loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()
            if put is not None and put(x).device == dev:
                xla_dtensor.sync()
            losses.append(loss.item())
            compiles.append(metrics.counters()["compiles"])
        return losses, compiles
    want, _ = run(_mlp(), lambda t: t)
    got, compiles = run(_mlp().to(dev), lambda t: t.to(dev))
    assert fused_calls == [op] * 5
    assert compiles[-1] == compiles[2], compiles  # steps 4 and 5 (new rates) reuse step 3's programs
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)


def test_equal_step_counters_are_one_program_value(dev):
    """The counters are one value (one program output, one leaf shared by their storages); a later
    write to one of them changes that one alone."""
    from xla_dtensor.core.tensor import value_of
    model = _mlp().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    _run(model, opt, put=lambda t: t.to(dev))
    steps = [st["step"] for st in opt.state.values()]
    assert len(steps) == 4 and len({id(value_of(s)) for s in steps}) == 1
    assert [s.item() for s in steps] == [float(len(BATCHES))] * 4
    steps[1].add_(5)
    xla_dtensor.sync()
    assert [s.item() for s in steps] == [3.0, 8.0, 3.0, 3.0]


@pytest.mark.parametrize("alike", [True, False])
def test_foreach_add_over_counters_holding_one_value_records_one_item(dev, alike):
    """``_foreach_add_`` over 0-d tensors holding one value records one item (an op node and its one
    output) and writes it to all; other lists (different values, a matrix among them) record every
    item. Values against torch CPU's, and a later write to one counter changes that one alone."""
    from xla_dtensor.core.tensor import rebind, value_of
    cpu = [torch.tensor(3.0) for _ in range(6)] if alike else [torch.tensor(float(i)) for i in range(6)]
    lazy = [t.to(dev) for t in cpu]
    if alike:  # one value, as torch's optimizer makes its counters
        xla_dtensor.sync()
        for t in lazy[1:]:
            rebind(t, value_of(lazy[0]))
    before = xla_dtensor.metrics.snapshot()
    torch._foreach_add_(lazy, 1)
    recorded = xla_dtensor.metrics.diff(before)["ops_recorded"]
    torch._foreach_add_(cpu, 1)
    assert recorded == (2 if alike else 7)
    assert (len({id(value_of(t)) for t in lazy}) == 1) is alike
    assert [t.item() for t in lazy] == [t.item() for t in cpu]
    lazy[2].add_(5)
    cpu[2].add_(5)
    mixed = lazy[:3] + [torch.ones(2, device=dev)]
    torch._foreach_add_(mixed, 2)  # not all 0-d: every item recorded
    torch._foreach_add_(cpu[:3], 2)
    xla_dtensor.sync()
    assert [t.item() for t in lazy] == [t.item() for t in cpu]
    assert mixed[3].cpu().tolist() == [3.0, 3.0]
