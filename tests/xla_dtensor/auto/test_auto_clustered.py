"""AUTO through ``distribute_module(..., "AUTO")`` on a 6-layer GPT-2 takes the clustered path
(layers solved once, :func:`autoshard.layered.solve_layered`) and trains like torch CPU.

Oracles: torch CPU eager (3 AdamW steps, losses at rtol 1e-3) and the unclustered exact solve of
the very graph AUTO planned (``cluster=False``): the clustered plan's modelled step must equal it.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import distribute_module as torch_distribute_module

import autoshard
import xla_dtensor
import xla_dtensor.spmd as xs
from autoshard.models import GPT2, GPT2Config
from tests._train import train
from tests.xla_dtensor.auto._baselines import greedy_baselines

CFG = GPT2Config(vocab=128, n_positions=16, n_embd=64, n_layer=6, n_head=4)


def _batches(n: int) -> list:
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, CFG.vocab, (8, 16), generator=g), torch.randint(0, CFG.vocab, (8, 16), generator=g))
            for _ in range(n)]


@pytest.fixture(scope="module", autouse=True)
def _greedy_baselines():
    """The manual baselines completed greedily (~17 s less here): no test here reads them or the guard (the
    oracle is the proven optimum)."""
    with greedy_baselines():
        yield


@pytest.fixture(scope="module")
def auto6(dev) -> dict:
    """The 6-layer GPT-2 trained on CPU and through AUTO; what AUTO passed to ``autoshard.solve`` and the
    solve's progress lines (passed on to what AUTO asked for: the default prints them after 5 s)."""
    torch.manual_seed(0)
    model = GPT2(CFG)
    batches = _batches(3)
    cpu = copy.deepcopy(model)
    ref = train(cpu, batches, torch.optim.AdamW(cpu.parameters(), lr=3e-3))
    seen: list = []
    lines: list[str] = []
    real = autoshard.solve

    def spy(graph, mesh, topo, *args, **kwargs):  # noqa: ANN001, ANN202
        seen.append((graph, mesh, topo, args, kwargs))
        asked = kwargs.get("progress")
        say = autoshard.api._Progress() if asked is None else asked

        def progress(msg: str) -> None:
            lines.append(msg)
            if say:
                say(msg)
        return real(graph, mesh, topo, *args, **{**kwargs, "progress": progress})

    auto = copy.deepcopy(model)
    mesh = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("data", "model"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(autoshard, "solve", spy)
        torch_distribute_module(auto, mesh, partition_fn="AUTO")
        opt = torch.optim.AdamW(auto.parameters(), lr=3e-3)
        got = train(auto, batches, opt, put=lambda t: t.to(dev), sync=xla_dtensor.sync)
    return dict(ref=ref, got=got, auto=auto, seen=seen, lines=lines, real=real)


def test_auto_clusters_a_six_layer_gpt2_and_trains_like_cpu(auto6) -> None:
    ref, got, auto, seen, real = (auto6[k] for k in ("ref", "got", "auto", "seen", "real"))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=0)

    plan = auto._auto_plan
    cl = plan.stats["clustering"]
    assert (cl["layers"], cl["identical"], cl["kept"], cl["weight"], cl["prefix"]) == (6, [1, 4], [1, 2, 4], 2, "h")
    assert cl["reduced_nodes"] < cl["graph_nodes"]
    assert plan.stats["remat"]["count"] == 0  # no memory budget: nothing to checkpoint
    # every layer's parameters are placed, a dropped layer's like the middle one's
    assert plan.placements["h.3.mlp.c_fc.weight"] == plan.placements["h.2.mlp.c_fc.weight"]
    assert any(s != "R" for s in plan.placements["input:0"])  # the batch is split (data parallel is optimal here)
    text = plan.explain()
    assert "layer clustering: h.1..4 of 6 layers are identical" in text and "activation checkpointing: none" in text

    graph, m, topo, args, kwargs = seen[0]
    oracle = real(graph, m, topo, *args, **{**kwargs, "cluster": False, "cache": False, "progress": False})
    assert "clustering" not in oracle.stats and oracle.status == plan.status == "OPTIMAL"
    assert abs(plan.objective - oracle.objective) <= 1e-9 * oracle.objective, (plan.objective, oracle.objective)


def test_cluster_switch_and_threshold(auto6) -> None:
    from mesh import Mesh, topology_for
    from autoshard.fx_builder import trace_training_step

    def graph(layers: int) -> object:
        cfg = GPT2Config(vocab=96, n_positions=16, n_embd=32, n_layer=layers, n_head=2)
        with torch.device("meta"):
            model = GPT2(cfg)
        return trace_training_step(model, (torch.zeros(8, 16, dtype=torch.long, device="meta"),) * 2)

    m = Mesh(range(8), (2, 4), ("data", "model"), validate=False)
    topo = topology_for(m, "h100")
    # 6 layers (cluster=None): the clustered path, which says so first: AUTO's own solve of the 6-layer GPT-2
    # (cluster=False on that graph, and the clustered objective equal to the unclustered one, are the oracle
    # of test_auto_clusters_a_six_layer_gpt2_and_trains_like_cpu)
    assert "clustering" in auto6["auto"]._auto_plan.stats
    assert auto6["lines"] and auto6["lines"][0].startswith("clustered: layers 1..4 of 6"), auto6["lines"]
    # 5 layers: an interior run of 3 (< 4): the plain solve unless forced
    g5 = graph(5)
    assert "clustering" not in autoshard.solve(g5, m, topo, time_limit=30, cache=False).stats
    assert autoshard.solve(g5, m, topo, time_limit=30, cache=False, cluster=True).stats["clustering"]["weight"] == 1
