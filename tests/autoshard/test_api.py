"""solve() against brute force, plan serialization/explanation, warnings and cache."""
from __future__ import annotations

import mesh  # noqa: F401

import warnings

import pytest
from mesh import Mesh, topology_for

from autoshard.api import clear_cache, solve
from autoshard.solver.brute import brute_force
from autoshard.build import UnknownOpWarning, build_model
from autoshard.fold import fold_ties
from autoshard.graph import Graph, TensorMeta
from autoshard.plan import Plan


def _mlp(batch: int, hidden: int, extra_op: str | None = None) -> Graph:
    g = Graph(name=f"mlp{batch}x{hidden}")
    x = g.add("placeholder", (), (TensorMeta((batch, 8)),), role="input", name="x")
    w1 = g.add("placeholder", (), (TensorMeta((8, hidden)),), role="param", name="w1")
    w2 = g.add("placeholder", (), (TensorMeta((hidden, 8)),), role="param", name="w2")
    h = g.add("aten.mm.default", ((x, 0), (w1, 0)), (TensorMeta((batch, hidden)),))
    a = g.add("aten.gelu.default", ((h, 0),), (TensorMeta((batch, hidden)),))
    if extra_op:
        a = g.add(extra_op, ((a, 0),), (TensorMeta((batch, hidden)),))
    y = g.add("aten.mm.default", ((a, 0), (w2, 0)), (TensorMeta((batch, 8)),))
    s = g.add("aten.sum.default", ((y, 0),), (TensorMeta(()),))
    g.outputs = [(s, 0)]
    return g


@pytest.mark.parametrize("batch,hidden,shape", [(4096, 16, (4,)), (8, 4096, (4,)), (64, 512, (2, 2))])
def test_solve_equals_brute_force(batch, hidden, shape):
    m = Mesh(range(4), shape)
    topo = topology_for(m, "tpu-v5e")
    plan = solve(_mlp(batch, hidden), m, topo, time_limit=20)
    folded = fold_ties(build_model(_mlp(batch, hidden), topo).problem, build_model(_mlp(batch, hidden), topo).ties)
    cost, _, _ = brute_force(folded.problem)
    assert plan.objective == pytest.approx(cost, rel=1e-9, abs=1e-15)
    assert plan.status == "OPTIMAL"


def test_solve_with_budget_equals_brute_force():
    m = Mesh(range(4), (4,))
    topo = topology_for(m, "tpu-v5e")
    g = _mlp(8, 4096)
    free = solve(g, m, topo, time_limit=20)
    budget = free.memory["peak"] * 0.6
    model = build_model(g, topo, budget)
    cost, _, _ = brute_force(fold_ties(model.problem, model.ties).problem)
    plan = solve(g, m, topo, memory_budget=budget, time_limit=20)
    assert plan.objective == pytest.approx(cost, rel=1e-9)
    assert plan.memory["peak"] <= budget


def test_plan_json_roundtrip_explain_and_cache():
    clear_cache()
    m = Mesh(range(4), (2, 2), ("data", "model"))
    g = _mlp(64, 512)
    plan = solve(g, m, topology_for(m, "tpu-v5e"), time_limit=20)
    assert solve(g, m, topology_for(m, "tpu-v5e"), time_limit=20) is plan
    again = Plan.from_json(plan.to_json())
    assert again == plan
    text = plan.explain()
    for name in ("w1", "w2", "data_parallel", "megatron_tp", "fsdp"):
        assert name in text
    spec = plan.placements["w1"]
    ps = plan.partition_spec("w1")
    for p, axis in zip(spec, ("data", "model")):
        if p != "R":
            assert axis in str(ps[p[1]])


def test_unknown_op_runs_whole_with_warning_and_hands_on_slices():
    m = Mesh(range(4), (4,))
    g = _mlp(64, 64, extra_op="aten.my_custom_op.default")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan = solve(g, m, "tpu-v5e", time_limit=20, cache=False)
    assert any(issubclass(w.category, UnknownOpWarning) and "my_custom_op" in str(w.message) for w in caught)
    assert plan.stats["unknown_ops"] == ["aten.my_custom_op.default"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownOpWarning)
        model = build_model(g, topology_for(m, "tpu-v5e"))
    v = next(n.id for n in g.nodes if n.op == "aten.my_custom_op.default")
    # its input is gathered and its work is not divided, but its output may be sliced for the next op
    assert all(s.in_specs == (("R",),) and s.split == 1 for s in model.strategies[v])
    assert {s.out_specs[0] for s in model.strategies[v]} == {("R",), (("S", 0),), (("S", 1),)}


def test_bad_budget_is_rejected():
    m = Mesh(range(4), (4,))
    with pytest.raises(ValueError, match="memory_budget"):
        solve(_mlp(8, 8), m, "tpu-v5e", memory_budget=-1.0)


def test_cli_prints_plan_and_baselines(capsys, tmp_path):
    from autoshard.__main__ import main

    out_json = tmp_path / "plan.json"
    assert main(["plan", "--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "64", "--seq", "16",
                 "--batch", "8", "--mesh", "2x2", "--time-limit", "20", "--json", str(out_json)]) == 0
    text = capsys.readouterr().out
    assert "h.0.mlp.c_fc.weight" in text and "data_parallel" in text and "2d" in text
    assert Plan.from_json(out_json.read_text()).mesh_shape == (2, 2)
