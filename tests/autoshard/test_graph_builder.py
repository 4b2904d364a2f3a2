"""The make_fx builder against the torch model it traced (the oracle: torch's own modules)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autoshard.fx_builder import trace_training_step
from autoshard.graph import Graph, TensorMeta
from benchmarks.models import GPT2, GPT2Config


@pytest.fixture(scope="module")
def traced():
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=4))
    idx = torch.zeros(4, 8, dtype=torch.long)
    return model, trace_training_step(model, (idx, idx), fake=False)


def test_parameters_inputs_and_state_are_marked(traced):
    model, g = traced
    params = [n for n in g.nodes if n.role == "param"]
    assert [(n.name, n.out.shape) for n in params] == [(k, tuple(p.shape)) for k, p in model.named_parameters()]
    assert sum(n.role == "opt_state" for n in g.nodes) == 2 * len(params)
    assert sum(n.role == "input" for n in g.nodes) == 2


def test_gradients_and_alias_groups_match_parameters(traced):
    _, g = traced
    for p in g.param_ids():
        gid, idx = g.grads[p]
        assert g.nodes[gid].outputs[idx].shape == g.nodes[p].out.shape
        grp = next(a for a in g.alias_groups if a[0] == p)
        assert len({g.nodes[v].out.shape for v in grp}) == 1
        assert len(grp) >= 3 + 3  # param, exp_avg, exp_avg_sq + their in-place updates


def test_matmul_count_matches_linear_layers(traced):
    model, g = traced
    linears = sum(isinstance(m, nn.Linear) for m in model.modules())
    mms = sum(n.op in ("aten.mm.default", "aten.addmm.default") for n in g.nodes)
    assert mms == 3 * linears  # forward, grad-input, grad-weight per linear layer


def test_liveness_params_whole_step_activations_until_last_use():
    g = Graph()
    x = g.add("placeholder", (), (TensorMeta((8, 4)),), role="input", name="x")
    w = g.add("placeholder", (), (TensorMeta((4, 4)),), role="param", name="w")
    y = g.add("aten.mm.default", ((x, 0), (w, 0)), (TensorMeta((8, 4)),))
    z = g.add("aten.gelu.default", ((y, 0),), (TensorMeta((8, 4)),))
    s = g.add("aten.sum.default", ((z, 0), (y, 0)), (TensorMeta(()),))
    g.outputs = [(s, 0)]
    assert g.liveness() == [(0, 3), (0, 5), (2, 5), (3, 5), (0, 5)]


def test_bad_input_reference_is_rejected():
    g = Graph()
    with pytest.raises(ValueError, match="does not name an earlier"):
        g.add("aten.neg.default", ((3, 0),), (TensorMeta((2,)),))
