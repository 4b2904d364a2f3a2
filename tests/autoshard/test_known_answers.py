"""Known answers from the parallelism literature, on tiny GPT-2 training steps."""
from __future__ import annotations

import mesh  # noqa: F401  (virtual devices before JAX)

import pytest
import torch
from mesh import DeviceSpec, HybridMesh, Link, Mesh, Topology, topology_for

from autoshard.api import solve
from autoshard.build import build_model
from autoshard.fx_builder import trace_training_step
from autoshard.solver import MemoryBudgetError
from benchmarks.models import GPT2, GPT2Config


def _graph(n_layer: int, n_embd: int, batch: int, seq: int, n_head: int = 4, vocab: int = 64):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=vocab, n_positions=max(seq, 8), n_embd=n_embd, n_layer=n_layer, n_head=n_head))
    return trace_training_step(model, (torch.zeros(batch, seq, dtype=torch.long),) * 2)


@pytest.fixture(scope="module")
def data_heavy():
    return _graph(2, 64, 256, 64)


def _params(plan, g):
    return {n.name: plan.placements[n.name] for n in g.nodes if n.role == "param"}


def test_data_much_larger_than_weights_is_data_parallel(data_heavy):
    m = Mesh(range(8), (8,), ("data",))
    plan = solve(data_heavy, m, topology_for(m, "tpu-v5e"), time_limit=30)
    assert plan.status == "OPTIMAL"
    assert all(spec == ("R",) for spec in _params(plan, data_heavy).values())
    # the big matmuls split their rows (tokens = batch x sequence)
    model = build_model(data_heavy, topology_for(m, "tpu-v5e"))
    fwd = [n for n in data_heavy.nodes if n.op == "aten.addmm.default"]
    names = {n.name: plan.activations[n.name] for n in fwd}
    assert all(spec == (("S", 0),) for spec in names.values()), names
    assert model.problem.num_nodes > 0
    assert plan.objective <= plan.baselines["data_parallel"]["cost"] * (1 + 1e-9)


def test_huge_weights_small_batch_shards_weights():
    g = _graph(2, 512, 8, 8, n_head=8)
    m = Mesh(range(8), (8,), ("model",))
    plan = solve(g, m, topology_for(m, "tpu-v5e"), time_limit=30)
    big = {k: v for k, v in _params(plan, g).items() if k.endswith("weight") and len(plan.shapes[k]) == 2 and plan.shapes[k][0] >= 512}
    assert big and all(v != ("R",) for v in big.values()), big
    assert plan.objective < plan.baselines["data_parallel"]["cost"]


def test_tight_memory_budget_shards_optimizer_state(data_heavy):
    m = Mesh(range(8), (8,), ("data",))
    topo = topology_for(m, "tpu-v5e")
    free = solve(data_heavy, m, topo, time_limit=30)
    assert all(free.placements[k] == ("R",) for k, r in free.roles.items() if r == "opt_state")
    budget = free.memory["peak"] - 0.5 * free.memory["opt_state"]
    tight = solve(data_heavy, m, topo, memory_budget=budget, time_limit=60)
    assert tight.memory["peak"] <= budget
    sharded = [k for k, r in tight.roles.items() if r == "opt_state" and tight.placements[k] != ("R",)]
    assert sharded
    assert tight.objective >= free.objective - 1e-12


def test_budget_below_minimum_names_tensors(data_heavy):
    m = Mesh(range(8), (8,), ("data",))
    with pytest.raises(MemoryBudgetError) as info:
        solve(data_heavy, m, topology_for(m, "tpu-v5e"), memory_budget=1000.0, time_limit=30)
    text = str(info.value)
    assert "below the minimum" in text and "GiB" in text and "aten." in text
    assert info.value.min_peak > 1000.0


def test_hybrid_mesh_dcn_carries_only_batch_or_fsdp():
    g = _graph(2, 64, 128, 32)
    hm = HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"), num_granules=2)
    slow = DeviceSpec("slow", 1e10, 1e10, 16 * 2**30)  # compute-bound, so splitting work over DCN pays
    topo = Topology(("dcn", "ici"), (2, 4), (Link.from_bandwidth("dcn", 2e-5, 3),
                                              Link.from_bandwidth("ici", 1e-6, 100)), slow, "test")
    plan = solve(g, hm, topo, time_limit=60)
    loss = next(n.id for n in g.nodes if n.op.startswith("aten.nll_loss_forward"))
    chosen = {n.id: n for n in g.nodes if n.op in ("aten.addmm.default", "aten.mm.default") and n.id < loss}
    labels = set()
    for nid in chosen:
        spec = plan.activations[g.nodes[nid].name]
        labels.add(spec[0])
    assert ("S", 0) in labels, "DCN should split the batch when compute dominates"
    assert labels <= {"R", ("S", 0)}, labels  # never a hidden (tensor-parallel) split over DCN
    dcn_params = {plan.placements[n.name][0] for n in g.nodes if n.role == "param"}
    assert "P" not in dcn_params
