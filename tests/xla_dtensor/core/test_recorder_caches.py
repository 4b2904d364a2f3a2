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


def test_a_repeated_multi_output_op_shares_its_output_nodes(dev):
    """The first recording makes the outputs' nodes (without look-ups: the op node is new); the
    identical second one finds them all in the hash-consing table."""
    a = torch.arange(24.0).reshape(4, 6).to(dev)
    xla_dtensor.sync()
    before = metrics.snapshot()
    v1, i1 = a.max(dim=1)
    v2, i2 = a.max(dim=1)
    d = metrics.diff(before)
    assert value_of(v1) is value_of(v2) and value_of(i1) is value_of(i2) and value_of(v1) is not value_of(i1)
    assert d["hash_cons_hits"] == 3 and d["ops_recorded"] == 3  # the op and its two outputs, once
    want_v, want_i = torch.arange(24.0).reshape(4, 6).max(dim=1)
    torch.testing.assert_close(v2.cpu(), want_v)
    torch.testing.assert_close(i1.cpu(), want_i)
