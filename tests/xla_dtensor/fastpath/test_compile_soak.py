"""1,000 compiled steps under an LR schedule: no compile after warm-up, RSS and memory maps flat (``-m slow``)."""
from __future__ import annotations

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


def _maps() -> int:
    with open("/proc/self/maps") as f:
        return sum(1 for _ in f)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["float", "cpu"])
def test_1000_steps_of_a_lambda_schedule_keep_memory_flat(dev, kind):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 16)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2 if kind == "float" else torch.tensor(1e-2))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + 0.01 * s))

    @xla_dtensor.compile
    def step(model, opt, x, y):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    x, y = torch.randn(8, 16).to(dev), torch.randn(8, 16).to(dev)
    rss, maps = [], []
    for i in range(1000):
        step(model, opt, x, y).item()
        sched.step()
        if i == 99:
            before = metrics.snapshot()
        if i % 100 == 99:
            rss.append(_rss_mib())
            maps.append(_maps())
    d = metrics.diff(before)
    print(f"\n{kind} lr: RSS MiB at steps 100..1000: {[round(r, 1) for r in rss]}; /proc/self/maps: {maps}; {d}")
    assert d["compiles"] == 0 and d["compile_traces"] == 0, d
    assert rss[-1] - rss[0] < 20, rss
    assert maps[-1] - maps[0] < 50, maps
