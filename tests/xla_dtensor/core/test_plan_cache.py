"""A repeated step's plan read off the tape (core.plan_cache) equals the graph walk's, on one device and
sharded (DP, 2x4 TP, FSDP, AUTO), on transformers' GPT-2.

Oracles: ``executor.make_plan`` (the walk) on the same roots at every sync, node for node;
torch CPU eager for the losses; hand-built graphs whose node hashes agree but whose wiring
or layout does not.
"""
from __future__ import annotations

import copy
import weakref

import jax.numpy as jnp
import pytest
import torch

import xla_dtensor
import xla_dtensor.spmd as xs
from xla_dtensor import metrics
from xla_dtensor.core import executor, ir, plan_cache
from xla_dtensor.core.ir import data_leaf, make_node
from xla_dtensor.core.tensor import value_of
from xla_dtensor.fsdp import shard_model

from tests._train import sharded_batch, train
from tests.xla_dtensor.ops._attention_models import hf_gpt2, tp_2x4


@pytest.fixture
def checked(monkeypatch):
    """Every sync's plan compared with a fresh walk of the same roots; yields the syncs' (reused?) list."""
    seen: list[bool] = []
    real = plan_cache.plan

    def spy(roots, walk):
        before = metrics.counters()["plans_reused"]
        got = real(roots, walk)
        want = executor.make_plan(roots)
        assert got.struct == want.struct and got.wiring == want.wiring and got.outs == want.outs
        assert [id(n) for n in got.order] == [id(n) for n in want.order]
        assert [id(n) for n in got.leaves] == [id(n) for n in want.leaves]
        assert got.fns == want.fns and got.shardings == want.shardings
        seen.append(metrics.counters()["plans_reused"] > before)
        return got
    monkeypatch.setattr(plan_cache, "plan", spy)
    return seen


def _adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def _loss(model):
    return lambda x, y: model(input_ids=x, labels=y).loss


BATCHES = [(torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(s)),
            torch.randint(0, 64, (8, 16), generator=torch.Generator().manual_seed(s + 100))) for s in range(6)]


def _layout(mode: str, model: torch.nn.Module, dev):
    """``model`` on the device laid out for ``mode``, and the batch placer."""
    if mode == "one":
        return model.to(dev), (lambda t: t.to(dev))
    if mode == "dp":
        return model.to(dev), sharded_batch(xs.Mesh(range(8), (8,), ("data",)), dev)
    if mode == "tp":
        return tp_2x4(model.to(dev)), (lambda t: t.to(dev))
    if mode == "fsdp":
        return shard_model(model, xs.Mesh(range(8), (8,), ("fsdp",))), (lambda t: t.to(dev))
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    return xs.distribute_module(model, mesh, partition_fn=xs.AutoPolicy(time_limit=5, cache_dir=False)), \
        (lambda t: t.to(dev))


@pytest.fixture(scope="module")
def hf_cpu_losses():
    """transformers' GPT-2 as it is trained, without a KV cache (``use_cache=False``): each forward then reads
    to the host whether the positions pack several sequences (``masking_utils.find_packed_sequence_indices``),
    a host read in the middle of every step; and torch CPU eager's losses."""
    model = hf_gpt2(1, "eager")
    model.config.use_cache = False
    ref = copy.deepcopy(model)
    return model, train(_loss(ref), BATCHES, _adamw(ref.parameters()))


@pytest.mark.filterwarnings("ignore::autoshard.solver.SolverTimeoutWarning")
@pytest.mark.parametrize("mode,cache", [("one", False), ("dp", False), ("tp", False), ("fsdp", False),
                                        ("auto", False), ("one", True)])
def test_hf_gpt2_steps_reuse_the_walk_and_train_like_cpu(hf_cpu_losses, checked, dev, mode, cache):
    base, want = hf_cpu_losses
    base = copy.deepcopy(base)
    base.config.use_cache = cache  # with a cache: no host read; the cache starts from empty host tensors
    model, put = _layout(mode, base, dev)
    reads = metrics.counters()["transfers_to_host"]
    got = train(_loss(model), BATCHES, _adamw(model.parameters()), put=put, sync=xla_dtensor.sync)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-5)
    assert sum(checked) >= 3, checked  # the steps after the optimizer's first ones repeat
    # what the case is about: the loss read after each step, and without a cache the mask's read inside it
    assert metrics.counters()["transfers_to_host"] - reads == (1 if cache else 2) * len(BATCHES)


def _leaves():
    return [data_leaf(jnp.ones(3), (3,), torch.float32) for _ in range(2)]


def _add(a, b):
    return make_node("add", ("add",), hash(("add",)), (a, b), jnp.add)


def test_equal_node_hashes_with_other_wiring_are_another_structure():
    a, b = _leaves()
    ir.clear_cons()
    n1 = _add(a, b)
    s1 = plan_cache._structure([n1])
    ir.clear_cons()
    n2 = _add(a, a)
    s2 = plan_cache._structure([n2])
    ir.clear_cons()
    assert n1.hash == n2.hash and a.hash == b.hash  # leaves hash by metadata: the hashes cannot tell them apart
    assert s1[0] != s2[0]
    ir.clear_cons()
    assert plan_cache._structure([_add(a, b)])[0] == s1[0]  # and the same wiring again is the same structure


def test_two_tape_structures_of_one_program_share_its_structure_object():
    """A dead node on one tape makes another tape structure but the same program: the plans'
    structures are then one object, so the program cache compares keys by identity."""
    plan_cache._STRUCTS.clear()  # (earlier tests' structures: a full table is emptied, which would split this one's)
    a, b = _leaves()
    plans, keys = [], []
    for dead in (False, True, False, True):
        ir.clear_cons()
        if dead:
            _add(b, b)
        root = _add(a, b)
        keys.append(plan_cache._structure([root])[0])
        plans.append(plan_cache.plan([root], executor.make_plan))
    ir.clear_cons()
    assert keys[0] != keys[1] and keys[0] == keys[2] and keys[1] == keys[3]
    assert all(p.struct is plans[0].struct for p in plans)
    assert plans[0].struct == executor.make_plan([_add(a, b)]).struct
    ir.clear_cons()


def test_a_sharding_set_on_a_node_is_another_structure():
    a, b = _leaves()
    ir.clear_cons()
    plain = plan_cache._structure([_add(a, b)])[0]
    ir.clear_cons()
    n = _add(a, b)
    n.sharding = object()  # as an activation table sets it: by identity, not by the node's key
    assert plan_cache._structure([n])[0] != plain
    ir.clear_cons()


def test_a_value_pending_across_a_host_read_stays_on_the_tape(dev, checked):
    x = torch.ones(4, device=dev)
    xla_dtensor.sync()
    for i in range(3):
        y = x * 2  # pending across the host read below, which starts a new tape
        assert (x * (3 + i)).cpu().tolist() == [3.0 + i] * 4
        z = y + 1
        tape, base = ir.recorded()
        assert [n.tix for n in tape] == list(range(base, base + len(tape)))
        assert value_of(y) in tape and plan_cache._structure([value_of(z)]) is not None
        xla_dtensor.sync()
        assert z.cpu().tolist() == [3.0] * 4
    assert checked[-1] is True  # the third sync's plan read off the tape; ``checked`` compares each with the walk


def test_a_host_read_keeps_no_dead_node_on_the_tape(dev):
    """A loop of host reads without ``sync()``: each read drops from the tape what nothing holds any more, the
    device data it read with it, as the table of the old tape did."""
    x = torch.ones(4, device=dev)
    xla_dtensor.sync()
    dead: list[weakref.ref] = []
    sums = []  # NOTE: reads outside ``assert``, whose rewriting by pytest would hold the temporaries
    for i in range(5):
        h = torch.full((4,), float(i)).to(dev)  # a new device-data leaf each round
        dead.append(weakref.ref(value_of(h)))
        sums.append((x * h).sum().item())
        del h
    held = x * 5
    sums.append((x * 2).sum().item())
    assert sums == [0.0, 4.0, 8.0, 12.0, 16.0, 8.0]
    assert all(r() is None for r in dead)
    tape, _ = ir.recorded()
    node = value_of(held)
    assert node in tape and {id(n) for n in tape} <= {id(node), *map(id, node.inputs)}  # x's leaf, the 5
    assert held.cpu().tolist() == [5.0] * 4


def test_past_the_tape_limit_the_graph_is_walked(dev, checked, monkeypatch):
    monkeypatch.setattr(ir, "TAPE_LIMIT", 4)
    x = torch.ones(3, device=dev)
    for _ in range(3):
        y = x
        for _ in range(6):
            y = y + 1
        assert ir.recorded() is None
        xla_dtensor.sync()
        assert y.cpu().tolist() == [7.0] * 3
    assert not any(checked)


def test_one_layout_in_two_spellings_is_one_leaf_hash():
    """XLA returns a replicated matrix's layout as ``P()`` or ``P(None, None)`` by program; as leaf keys
    the two made a second program of one step (an AUTO BERT's third step compiled again)."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    m = xs.Mesh(range(8), (2, 4), ("data", "model")).jax_mesh()
    a, b, c = (jax.device_put(np.ones((4, 8), np.float32), NamedSharding(m, spec))
               for spec in (P(), P(None, None), P("data", None)))
    keys = [data_leaf(x, (4, 8), torch.float32) for x in (a, b, c)]
    assert keys[0].hash == keys[1].hash and keys[0].key[3].spec == P() and keys[1].key[3].spec == P(None, None)
    assert keys[2].hash == hash((ir.DATA, (4, 8), torch.float32, NamedSharding(m, P("data"))))
    assert keys[2].hash != keys[0].hash
    assert ir.canonical(NamedSharding(m, P(None, "model"))).spec == P(None, "model")


def test_past_the_limit_the_least_recently_used_structure_is_forgotten(dev, checked, monkeypatch):
    """Three step structures with room for two: A used again before C arrives stays (B goes). Forgetting
    every structure at once, a new one made the others walk again (a long test run did, mid-loop)."""
    x = torch.ones(3, device=dev)
    xla_dtensor.sync()
    steps = {"A": lambda: x * 2, "B": lambda: x + 5, "C": lambda: (x - 1) * 3}
    want = {"A": 2.0, "B": 6.0, "C": 0.0}

    def run(names: str) -> list[bool]:
        start = len(checked)
        for name in names:
            y = steps[name]()
            xla_dtensor.sync()
            assert y.cpu().tolist() == [want[name]] * 3
        return checked[start:]
    run("ABCABC")  # each structure as a repeated step records it
    monkeypatch.setattr(plan_cache, "_LAID", {})
    monkeypatch.setattr(plan_cache, "LIMIT", 2)
    assert run("ABACAB") == [False, False, True, False, True, False]
