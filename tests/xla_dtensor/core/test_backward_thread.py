"""``config.backward_on_caller``: a thread's backward on the device runs on that thread (the default),
or on torch's autograd device thread (``False``); training matches torch CPU either way, on one
device and sharded (DP, 2x4 Megatron, FSDP, AUTO).

Each case runs in a new Python thread, because the switch is read at a thread's first op on the
device. The oracle for where the backward ran: the thread ident seen by a gradient hook on the
first layer's weight (torch runs tensor hooks on the thread that runs the backward node).
"""
from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from tests._train import sharded_mlp, train

from .test_threads import run_threads

pytestmark = pytest.mark.filterwarnings("ignore::xla_dtensor.debug.analysis.RecompileWarning")

BATCHES = [(torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s)),
            torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(s + 50))) for s in range(3)]


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


@pytest.fixture(scope="module")
def reference() -> list[float]:
    cpu = _mlp()
    return train(lambda x, y: F.mse_loss(cpu(x), y), BATCHES, torch.optim.AdamW(cpu.parameters(), lr=1e-2))


@pytest.mark.parametrize("on_caller", [True, False], ids=["caller", "engine"])
@pytest.mark.parametrize("mode", ["one", "dp", "megatron", "fsdp", "auto"])
def test_backward_thread_follows_the_switch_and_trains_like_cpu(mode, on_caller, reference, monkeypatch):
    monkeypatch.setattr(xla_dtensor.config, "backward_on_caller", on_caller)
    dev = xla_dtensor.device()
    model = _mlp()  # seeded: built on the test's thread
    model, put = (model.to(dev), (lambda t: t.to(dev))) if mode == "one" else sharded_mlp(mode, model, dev)
    weight = next(model.parameters())

    def job() -> tuple[int, list[int], bool, list[float]]:
        seen: list[int] = []
        handle = weight.register_hook(lambda g: seen.append(threading.get_ident()))
        try:
            losses = train(lambda x, y: F.mse_loss(model(x), y), BATCHES,
                           torch.optim.AdamW(model.parameters(), lr=1e-2), put=put, sync=xla_dtensor.sync)
        finally:
            handle.remove()
        return threading.get_ident(), seen, torch._C._is_multithreading_enabled(), losses

    me, seen, multithreaded, losses = run_threads([lambda barrier: job()])[0]  # a fresh Python thread
    assert len(seen) == len(BATCHES)
    assert multithreaded is not on_caller
    if on_caller:
        assert set(seen) == {me}
    else:
        assert me not in seen  # torch's autograd device thread
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(reference), rtol=1e-4, atol=1e-6)


def test_switch_rejects_a_non_bool():
    with pytest.raises(ValueError, match="backward_on_caller must be True or False, got 'yes'"):
        xla_dtensor.config.backward_on_caller = "yes"
    assert xla_dtensor.config.backward_on_caller is True
