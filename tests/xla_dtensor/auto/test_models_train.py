"""Llama, the wide MLP and ViT train 3 AdamW steps on the jax device like torch CPU; their IR plans cleanly."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import autoshard
import xla_dtensor
from benchmarks.models import llama, mlp, vit
from mesh import Mesh, topology_for
from xla_dtensor.auto import graph_from_ir, step_roles
from tests._train import train
from tests.xla_dtensor.auto._baselines import greedy_baselines

# one block each for Llama and ViT: every op of a block is in the graph AUTO plans (two blocks doubled the
# solve: the llama case took 12.6 s on the 2-core machine)
CASES = {
    "llama": (llama, llama.Llama, llama.LlamaConfig(vocab=64, dim=32, n_layers=1, n_heads=4, hidden_dim=64,
                                                     max_seq=16)),
    "mlp": (mlp, mlp.WideMLP, mlp.MLPConfig(in_dim=16, hidden=64, n_layers=3, out_dim=8)),
    "mlp-regression": (mlp, mlp.WideMLP, mlp.MLPConfig(in_dim=16, hidden=64, n_layers=2, out_dim=4,
                                                         task="regression")),
    "vit": (vit, vit.ViT, vit.ViTConfig(image_size=8, patch_size=4, dim=32, n_layers=1, n_heads=4, mlp_dim=64)),
}


def _train(model, batches, dev=None, graph_out=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)

    def capture(step):
        if graph_out is not None and step == 1:
            params, state = step_roles(model, opt)
            graph_out.append(graph_from_ir(params=params, opt_state=state))
    on_dev = dev is not None
    return train(model, batches, opt, put=(lambda t: t.to(dev)) if on_dev else None, after_step=capture,
                 sync=xla_dtensor.sync if on_dev else None)


@pytest.mark.parametrize("name", list(CASES))
def test_three_adamw_steps_match_cpu_and_ir_plans(dev, name):
    mod, cls, cfg = CASES[name]
    torch.manual_seed(0)
    model = cls(cfg)
    gen = torch.Generator().manual_seed(1)
    batches = [mod.make_batch(cfg, 8, generator=gen)] * 3  # one batch: the loss must fall
    ref = _train(copy.deepcopy(model), batches)
    graphs: list = []
    got = _train(copy.deepcopy(model).to(dev), batches, dev, graphs)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert ref[-1] < ref[0]
    (g,) = graphs
    assert {n.name for n in g.nodes if n.role == "param"} == {n for n, _ in model.named_parameters()}
    assert len(g.grads) == len(list(model.parameters()))
    m = Mesh(range(8), (2, 4), ("data", "model"))
    with warnings.catch_warnings(), greedy_baselines():  # the plan's baselines are not read here (-5 s)
        warnings.simplefilter("error", autoshard.UnknownOpWarning)
        plan = autoshard.solve(g, m, topology_for(m, "tpu-v5e"), time_limit=30, cache=False)
    assert plan.stats["unknown_ops"] == []
