"""The shortcuts of a repeated step's ``sync()`` (core.executor, core.plan_cache, core.signature) give
what the long way gives: output leaves whose keys and hashes are ``data_leaf``'s, the argument order
``arg_order`` computes, a plan whose nodes are the graph walk's, a signature of a list of tensors equal
to the per-item one; and training under them matches torch CPU, on one device and sharded (DP, 2x4
Megatron, FSDP, AUTO)."""
from __future__ import annotations

import jax
import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from xla_dtensor.core import executor, ir, plan_cache
from xla_dtensor.core.signature import OpInfo, _arg, signature
from xla_dtensor.core.tensor import live, value_of
from tests._train import sharded_mlp, train

pytestmark = pytest.mark.filterwarnings("ignore::xla_dtensor.debug.analysis.RecompileWarning")


def _mlp() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


BATCHES = [(torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s)),
            torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(s + 50))) for s in range(4)]


@pytest.fixture
def spied(monkeypatch) -> list[int]:
    """Every sync's output leaves checked against ``data_leaf``, its donated leaves against the plain
    rule and its layout against a fresh ``arg_order``; yields the number of syncs whose leaves came from the cached keys."""
    cached: list[int] = []
    real_out, real_layout = executor.out_leaves, executor.layout

    def out_leaves(arrays, metas):
        hit = executor._OUT_KEYS.get(id(executor._RAN))
        got = real_out(arrays, metas)
        want = [ir.data_leaf(a, m[0], m[1]) for a, m in zip(arrays, metas)]
        assert [(g.key, g.hash) for g in got] == [(w.key, w.hash) for w in want]
        assert all(g.data is a and g.fn is None for g, a in zip(got, arrays))
        cached.append(hit is not None and hit[0] is executor._RAN)
        return got

    def layout(roots, donate=None, partners=None, plan=None, donated=None):
        got = real_layout(roots, donate, partners, plan, donated)
        if got[1] is not None:
            fresh = executor.arg_order(len(got[0].leaves), set(donated if donated is not None else got[2]),
                                       [{id(n): i for i, n in enumerate(got[0].leaves)}.get(p) for p in partners or ()])
            assert list(got[1]) == fresh
            assert got[2] == tuple(range(len(fresh) - len(got[2]), len(fresh)))
        return got
    real_donated = executor._donated

    def donated(plan, held):
        got = real_donated(plan, held)
        # device arrays of rank > 0 no live storage holds (a packed member's pack is donated as a whole: core.packs)
        want = [i for i, n in enumerate(plan.leaves)
                if n.op == ir.DATA and n.key[1] != () and id(n) not in held and isinstance(n.raw, jax.Array)]
        assert got == want
        return got
    monkeypatch.setattr(executor, "_donated", donated)
    monkeypatch.setattr(executor, "out_leaves", out_leaves)
    monkeypatch.setattr(executor, "layout", layout)
    return cached


@pytest.mark.parametrize("mode", ["one", "dp", "megatron", "fsdp", "auto"])
def test_repeated_steps_take_the_shortcuts_and_train_like_cpu(mode, spied):
    dev = xla_dtensor.device()
    cpu_model = _mlp()
    ref = train(lambda x, y: F.mse_loss(cpu_model(x), y), BATCHES, torch.optim.AdamW(cpu_model.parameters(), lr=1e-2))
    model = _mlp()
    if mode == "one":
        model, put = model.to(dev), (lambda t: t.to(dev))
    else:
        model, put = sharded_mlp(mode, model, dev)
    got = train(lambda x, y: F.mse_loss(model(x), y), BATCHES, torch.optim.AdamW(model.parameters(), lr=1e-2),
                put=put, sync=xla_dtensor.sync)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=2e-4, atol=2e-5)
    assert sum(spied) >= 1, spied  # a later step's leaves came from the executable's cached keys


def test_list_signature_equals_the_per_item_one():
    dev = xla_dtensor.device()
    roots = [torch.full((3, 2), float(i), device=dev) for i in range(10)]
    info = OpInfo(torch.ops.aten._foreach_add.List)
    for items in (roots, roots[:5] + [roots[5][0]] + roots[6:], roots[:9] + [None]):
        fast, slow = [], []
        sig = signature((items, items), {}, info, True, fast)
        want = tuple(tuple(_arg(x, False, slow) for x in items) for _ in range(2))
        assert sig == want
        assert [id(n) for n in fast] == [id(n) for n in slow]
    assert [id(n) for n in fast[:9]] == [id(value_of(t)) for t in roots[:9]]


def test_reused_plan_fills_its_nodes_when_read_and_equals_the_walk():
    dev = xla_dtensor.device()
    x = torch.ones(4, device=dev)

    def step():
        return [(x * 2 + 1).sin()]
    for _ in range(4):  # (the first step also computes ``x``, the second reads it off the tape)
        out = step()
        roots = [value_of(t) for t in out]
        got, want = plan_cache.plan(roots, executor.make_plan), executor.make_plan(roots)
        xla_dtensor.sync()
    assert got._fill is not None  # the last step's plan came from the remembered layout, not yet filled
    assert got.struct == want.struct and got.outs == want.outs
    assert [id(n) for n in got.leaves] == [id(n) for n in want.leaves]
    assert [id(n) for n in got.order] == [id(n) for n in want.order] and got._fill is None
    assert got.fns == want.fns and got.wiring == want.wiring and got.shardings == want.shardings
    assert got._replace(outs=[0]).outs == [0] and got._replace(outs=[0]).order == got.order
    with pytest.raises(TypeError, match="no field"):
        got._replace(nodes=[])


def test_an_evicted_executable_drops_its_output_keys(monkeypatch):
    from xla_dtensor.config import config
    dev = xla_dtensor.device()
    monkeypatch.setattr(config, "cache_size", 1)
    a = torch.ones(3, device=dev) + 1
    xla_dtensor.sync()
    first = executor._RAN
    assert id(first) in executor._OUT_KEYS
    b = torch.ones(5, device=dev) * 3  # another program: the first one is evicted
    xla_dtensor.sync()
    assert id(first) not in executor._OUT_KEYS or executor._OUT_KEYS[id(first)][0] is not first
    torch.testing.assert_close(a.cpu(), torch.full((3,), 2.0))
    torch.testing.assert_close(b.cpu(), torch.full((5,), 3.0))
    assert all(s.value.fn is None for s in live() if s in (a._storage, b._storage))


def test_a_plan_left_unfilled_by_replace_and_node_at_still_equals_the_walk():
    dev = xla_dtensor.device()
    x = torch.ones(4, device=dev)
    for _ in range(4):
        out = (x * 3 - 1).cos()
        roots = [value_of(out)]
        got, want = plan_cache.plan(roots, executor.make_plan), executor.make_plan(roots)
        xla_dtensor.sync()
    assert not got.filled
    assert [id(got.node_at(i)) for i in range(len(want.order))] == [id(n) for n in want.order]
    other = got._replace(struct=(got.struct, "token"))
    assert not other.filled and not got.filled and other.struct == (want.struct, "token")
    assert [id(n) for n in other.order] == [id(n) for n in want.order] and other.filled
    assert [id(n) for n in got.order] == [id(n) for n in want.order]
