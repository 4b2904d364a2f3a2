"""Llama, the wide MLP and ViT trace (make_fx) and solve on a 2x4 mesh with a rule for every op."""
from __future__ import annotations

import mesh  # noqa: F401

import warnings

import pytest
import torch
from mesh import Mesh, topology_for

import autoshard
from benchmarks.models import llama, mlp, vit

MESH = Mesh(range(8), (2, 4), ("data", "model"))

CASES = {
    "llama": (llama, llama.Llama, llama.LlamaConfig(vocab=64, dim=32, n_layers=2, n_heads=4, hidden_dim=64,
                                                     max_seq=16)),
    "mlp": (mlp, mlp.WideMLP, mlp.MLPConfig(in_dim=32, hidden=128, n_layers=3, out_dim=8)),
    "mlp-regression": (mlp, mlp.WideMLP, mlp.MLPConfig(in_dim=32, hidden=128, n_layers=2, out_dim=8,
                                                         task="regression")),
    "vit": (vit, vit.ViT, vit.ViTConfig(image_size=8, patch_size=4, dim=32, n_layers=2, n_heads=4, mlp_dim=64)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_model_plans_on_2x4_mesh_without_unknown_ops(name):
    mod, cls, cfg = CASES[name]
    torch.manual_seed(0)
    model = cls(cfg)
    batch = mod.make_batch(cfg, 16, generator=torch.Generator().manual_seed(0))
    graph = autoshard.trace_training_step(model, batch, name=name)
    names = {n for n, _ in model.named_parameters()}
    assert {n.name for n in graph.nodes if n.role == "param"} == names
    with warnings.catch_warnings():
        warnings.simplefilter("error", autoshard.UnknownOpWarning)
        plan = autoshard.solve(graph, MESH, topology_for(MESH, "tpu-v5e"), time_limit=30, cache=False)
    assert set(plan.placements) >= names
    for n in names:  # every placement is a per-axis spec the shape admits
        spec, shape = plan.placements[n], plan.shapes[n]
        assert len(spec) == 2
        for axis, p in enumerate(spec):
            assert p == "R" or (p[0] == "S" and shape[p[1]] % MESH.shape()[MESH.axis_name(axis)] == 0), (n, spec)
    assert plan.stats["unknown_ops"] == []
    best = plan.best_baseline()
    assert best is not None and plan.objective <= best[1] * (1 + 1e-6)


def test_config_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="task='ranking'"):
        mlp.MLPConfig(task="ranking")
    with pytest.raises(ValueError, match="patch_size=3"):
        vit.ViTConfig(image_size=8, patch_size=3)
    with pytest.raises(ValueError, match="n_heads=3"):
        llama.LlamaConfig(dim=32, n_heads=3)
