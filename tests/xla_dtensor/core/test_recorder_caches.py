"""The recorder's per-step caches: the hash-consing table lives one step, scalar arrays are reused.

Oracles: torch CPU for values; the caches' own sizes and identities for the mechanism.
"""
from __future__ import annotations

import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core import executor, ir
from xla_dtensor.core.tensor import value_of


def test_cons_table_holds_one_step_and_is_emptied_at_sync(dev):
    x = torch.ones(3, device=dev)
    y = x.exp() * 2
    assert len(ir._CONS) >= 2
    xla_dtensor.sync()
    assert len(ir._CONS) == 0
    before = metrics.snapshot()
    z1, z2 = x.exp(), x.exp()  # after the barrier: consing works again
    assert value_of(z1) is value_of(z2)
    assert metrics.diff(before)["hash_cons_hits"] == 1
    torch.testing.assert_close(y.cpu(), torch.ones(3).exp() * 2)
    torch.testing.assert_close((x * 3).cpu(), torch.full((3,), 3.0))  # pending: this read executes
    assert all(n is not value_of(z1) for n in ir._CONS.values())  # a host read is a barrier too


def test_cons_table_is_bounded(dev, monkeypatch):
    monkeypatch.setattr(ir, "CONS_LIMIT", 8)
    x = torch.ones(3, device=dev)
    y = x
    for _ in range(30):
        y = y + 1
        assert len(ir._CONS) <= 8
    torch.testing.assert_close(y.cpu(), torch.full((3,), 31.0))


def test_scalar_arrays_reused_while_values_repeat(dev):
    p = torch.nn.Parameter(torch.ones(4, device=dev))
    ref = torch.nn.Parameter(torch.ones(4))
    xla_dtensor.sync()
    made = []
    orig = executor._scalar_array
    monkey = lambda v, sh: made.append(v) or orig(v, sh)  # noqa: E731
    executor._scalar_array = monkey
    try:
        for lr in (0.5, 0.3, 0.3, 0.3, 0.7):  # the first step (0.5) compiles
            for w in (p, ref):
                with torch.no_grad():
                    w.mul_(lr).add_(lr)
            xla_dtensor.sync()
    finally:
        executor._scalar_array = orig
    assert made.count(0.3) == 2 and made.count(0.7) == 2  # two slots; the repeated steps made none
    torch.testing.assert_close(p.detach().cpu(), ref.detach())
