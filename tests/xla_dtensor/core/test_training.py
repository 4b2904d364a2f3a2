"""Training on the jax device matches torch CPU eager; steady state compiles once."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from benchmarks.models import GPT2, GPT2Config
from benchmarks.models.resnet import ResNet, ResNetConfig
from xla_dtensor import metrics


def _train(model, opt_fn, batches, loss_fn, dev=None, clip=None):
    opt = opt_fn(model.parameters())
    losses, compiles, host = [], [], []
    for batch in batches:
        if dev is not None:
            batch = [b.to(dev) for b in batch]
        before = metrics.snapshot()
        loss = loss_fn(model, *batch)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad()
        host.append(metrics.diff(before)["transfers_to_host"])
        if dev is not None:
            xla_dtensor.sync()
        compiles.append(metrics.diff(before)["compiles"])
        losses.append(loss.item())
    return losses, compiles, host


def _gpt_loss(model, idx, tgt):
    return model(idx, tgt)


@pytest.fixture(scope="module")
def gpt_setup():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))
               for _ in range(20)]
    return GPT2(cfg), batches


def test_gpt2_adamw_20_steps_matches_cpu_and_compiles_once(dev, gpt_setup):
    model, batches = gpt_setup
    adamw = lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.1)  # noqa: E731
    ref, _, _ = _train(copy.deepcopy(model), adamw, batches, _gpt_loss, clip=1.0)
    got, compiles, host = _train(copy.deepcopy(model).to(dev), adamw, batches, _gpt_loss, dev, clip=1.0)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert ref[-1] < ref[0]
    assert all(c == 0 for c in compiles[2:]), compiles  # steps 0 and 1 differ (optimizer state creation)
    assert all(h == 0 for h in host), host  # no host sync inside forward/backward/clip/step


@pytest.mark.parametrize("opt_fn,ref_fn", [
    (lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), None),
    (lambda p: torch.optim.Adam(p, lr=1e-2, foreach=True), None),
    # torch allows capturable only on accelerators: the CPU oracle runs the same math uncaptured
    (lambda p: torch.optim.AdamW(p, lr=1e-2, capturable=True), lambda p: torch.optim.AdamW(p, lr=1e-2)),
    (lambda p: torch.optim.Adam(p, lr=1e-2, foreach=False), None),
], ids=["sgd-momentum", "adam-foreach", "adamw-capturable", "adam-single-tensor"])
def test_optimizers_match_cpu(dev, gpt_setup, opt_fn, ref_fn):
    model, batches = gpt_setup
    ref, _, _ = _train(copy.deepcopy(model), ref_fn or opt_fn, batches[:4], _gpt_loss)
    got, compiles, _ = _train(copy.deepcopy(model).to(dev), opt_fn, batches[:4], _gpt_loss, dev)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert compiles[3] == 0


@pytest.mark.parametrize("norm", ["group", "batch"])
def test_resnet_5_steps_matches_cpu(dev, norm):
    torch.manual_seed(0)
    net = ResNet(ResNetConfig(channels=(8, 16), num_classes=10, norm=norm))
    g = torch.Generator().manual_seed(2)
    batches = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 10, (4,), generator=g)) for _ in range(5)]
    loss_fn = lambda m, x, y: F.cross_entropy(m(x), y)  # noqa: E731
    sgd = lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)  # noqa: E731
    ref_net, lazy_net = copy.deepcopy(net), copy.deepcopy(net).to(dev)
    ref, _, _ = _train(ref_net, sgd, batches, loss_fn)
    got, compiles, _ = _train(lazy_net, sgd, batches, loss_fn, dev)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert all(c == 0 for c in compiles[2:]), compiles
    # buffers (batch norm running statistics, batch counters) and eval-mode outputs too
    for (name, want), got_buf in zip(ref_net.named_buffers(), lazy_net.buffers()):
        torch.testing.assert_close(got_buf.cpu(), want, rtol=1e-4, atol=1e-6, msg=name)
    x = batches[0][0]
    torch.testing.assert_close(lazy_net.eval()(x.to(dev)).cpu(), ref_net.eval()(x), rtol=1e-4, atol=1e-5)
