"""``loss.backward()`` launches a lazy step in phases (core.phases, ``config.launch_at_backward``): the
forward as it starts, the gradients as it ends. Against torch CPU: values of one device, DP, 2x4 Megatron,
FSDP and transformers' Llama; AUTO, ``compile`` and eager mode launch nothing; a repeated phased step
reuses each phase's plan and program."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core import phases
from xla_dtensor.core.tensor import value_of

from tests._train import MLP_BATCHES, mlp, sharded_mlp_like_cpu, train


@pytest.fixture
def phased(monkeypatch):
    monkeypatch.setattr(config, "launch_at_backward", True)


def _runs() -> int:
    return metrics.counters()["executions"]


def _pending(t: torch.Tensor) -> bool:
    return value_of(t).fn is not None


def test_the_default_on_cpu_is_one_program_and_the_setting_is_checked(dev):
    assert config.launch_at_backward is None and not phases.launches()  # these tests run on CPU
    model = mlp().to(dev)
    loss = F.mse_loss(model(MLP_BATCHES[0][0].to(dev)), MLP_BATCHES[0][1].to(dev))
    runs = _runs()
    loss.backward()
    assert _runs() == runs and _pending(loss) and _pending(model[0].weight.grad)
    xla_dtensor.sync()
    with pytest.raises(ValueError, match="launch_at_backward must be True, False or None .*, got 'gpu'"):
        config.launch_at_backward = "gpu"
    assert config.launch_at_backward is None


def test_backward_launches_the_forward_then_the_gradients(dev, phased):
    ref, model = mlp(), mlp().to(dev)
    x, y = MLP_BATCHES[0]
    want = F.mse_loss(ref(x), y)
    want.backward()
    loss = F.mse_loss(model(x.to(dev)), y.to(dev))
    assert _pending(loss)
    runs = _runs()
    loss.backward()
    assert _runs() == runs + 2  # the forward's program, then the gradients'
    assert not _pending(loss) and not _pending(model[0].weight.grad)
    torch.testing.assert_close(loss.cpu(), want.detach())
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-5, atol=1e-6)


def test_gradients_accumulated_over_micro_batches_match_cpu(dev, phased):
    ref, model = mlp(), mlp().to(dev)
    runs = _runs()
    for m, d in ((ref, "cpu"), (model, dev)):
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for x, y in MLP_BATCHES:
            (F.mse_loss(m(x.to(d)), y.to(d)) / len(MLP_BATCHES)).backward(retain_graph=True)
        opt.step()
    xla_dtensor.sync()
    assert _runs() - runs == 2 * len(MLP_BATCHES) + 1  # each backward's two launches, then the update
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-5, atol=1e-6)


def test_a_repeated_phased_step_reuses_each_phase_plan_and_program(dev, phased):
    """The GPT step's targets view, made in the forward and saved for the loss's backward, is made again
    after the forward's launch; from the stale node every backward launch walked its graph again."""
    from autoshard.models import GPT2, GPT2Config
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=2)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = [torch.randint(0, 64, (2, 16)).to(dev) for _ in range(2)]
    counts = []
    for _ in range(4):
        before = metrics.counters()
        train(lambda i, t: model(i, t), [batch], opt, sync=xla_dtensor.sync)
        counts.append({k: v for k, v in metrics.diff(before).items() if k in ("executions", "plans_reused", "compiles")})
    # forward, backward, optimizer step: each plan and program seen before
    assert counts[-2] == counts[-1] == {"executions": 3, "plans_reused": 3, "compiles": 0}


@pytest.mark.parametrize("mode", ["dp", "megatron", "fsdp", "auto"])
def test_sharded_training_matches_cpu(dev, phased, mode):
    _, runs = sharded_mlp_like_cpu(mode, dev, _runs)
    # AUTO plans on, and constrains, the whole step's graph at one sync: one program a step
    assert runs == len(MLP_BATCHES) * (1 if mode == "auto" else 3)
    assert phases.launches() is (mode != "auto")


def test_transformers_llama_trains_in_phases_like_torch_cpu(phased):
    """2x4 tensor parallel (one device in phases: the MLP tests above)."""
    from benchmarks.models.zoo import ZOO
    from benchmarks.models.zoo_train import train as zoo_train
    runs = _runs()
    res = zoo_train(ZOO["hf-llama"], "tp", 3)
    assert _runs() - runs >= 3 * 3
    torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(zoo_train(ZOO["hf-llama"], "cpu", 3).losses),
                               rtol=1e-3, atol=0)


def test_compile_and_eager_mode_launch_nothing_at_backward(dev, phased):
    ref, model = mlp(), mlp().to(dev)
    opt_ref, opt = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (ref, model))

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    compiled = xla_dtensor.compile(step)
    want = train(lambda x, y: F.mse_loss(ref(x), y), MLP_BATCHES, opt_ref)
    got = []
    for i, (x, y) in enumerate(MLP_BATCHES):
        runs = _runs()
        got.append(compiled(x.to(dev), y.to(dev)).item())
        if i:  # a replay: the recorded step as one program
            assert _runs() - runs == 1
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-5, atol=1e-6)
    xla_dtensor.eager_mode(True)
    try:
        assert not phases.launches()
        w = torch.ones(3, device=dev, requires_grad=True)
        (w * 2).sum().backward()
        torch.testing.assert_close(w.grad.cpu(), torch.full((3,), 2.0))
    finally:
        xla_dtensor.eager_mode(False)
    assert phases.launches()


def test_an_index_error_of_the_forward_is_raised_by_backward(dev, phased):
    emb = torch.nn.Embedding(4, 3).to(dev)
    loss = emb(torch.tensor([1, 7]).to(dev)).sum()
    with pytest.raises(IndexError, match="index out of range"):
        loss.backward()  # the forward launched at its start; its checks read at the end's launch
    xla_dtensor.sync()
