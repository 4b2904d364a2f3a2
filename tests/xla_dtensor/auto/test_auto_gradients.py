"""AUTO holds each gradient to its parameter's layout, and multi-output ops' outputs to the plan's.

Oracles: torch CPU eager (losses), the compiled partitioned HLO (which collectives run),
and the lazy IR itself (which node holds which output).
"""
from __future__ import annotations

import collections
import copy
import dataclasses
import re
import warnings

import pytest
import torch
from torch import nn

import autoshard
import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models.vit import ViT, ViTConfig, make_batch
from mesh import Mesh
from xla_dtensor.auto import step_roles
from xla_dtensor.auto.ir_graph import graph_from_ir_with_nodes
from xla_dtensor.core.ir import GETITEM
from tests._train import train

# NOTE: a real model end to end. Before the gradient constraint and the shape-only *_like rule,
# the cpu-preset plan on this mesh split the classifier's weight gradient on its hidden dim and
# XLA ran AdamW on the split gradient, gathering the weight and both moments back (3 all-gathers).
CFG = ViTConfig(image_size=16, patch_size=4, dim=64, n_layers=1, n_heads=2, mlp_dim=128, num_classes=16)
STEPS = 3


def _train(model, batch, dev=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    on_dev = dev is not None
    return train(model, [batch] * STEPS, opt, put=(lambda t: t.to(dev)) if on_dev else None,
                 sync=xla_dtensor.sync if on_dev else None)


@pytest.fixture(scope="module")
def vit_run(dev):
    torch.manual_seed(0)
    model = ViT(CFG)
    torch.manual_seed(1)
    batch = make_batch(CFG, 16)
    ref = _train(copy.deepcopy(model), batch)
    m = Mesh(range(8), (4, 2), ("data", "model"))
    auto = xs.distribute_module(model, m, partition_fn=xs.AutoPolicy(topology="cpu", cache_dir=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = _train(auto, batch, dev)
    return dict(ref=ref, got=got, model=auto, plan=xs.last_plan(), hlo=xs.last_compiled_hlo())


def test_auto_vit_trains_like_cpu(vit_run):
    torch.testing.assert_close(torch.tensor(vit_run["got"]), torch.tensor(vit_run["ref"]), rtol=1e-4, atol=0)


def test_optimizer_state_is_never_gathered(vit_run):
    """Every parameter the plan replicates is updated replicated: an all-gather of its full shape
    can only be its gradient's (once), never the parameter's or a moment's."""
    plan, hlo = vit_run["plan"], vit_run["hlo"]
    replicated = collections.Counter(tuple(p.shape) for n, p in vit_run["model"].named_parameters()
                                     if all(s == "R" for s in plan.placements[n]))
    gathered = _gathers(hlo)
    assert replicated
    for shape, n in replicated.items():
        assert gathered[shape] <= n, (shape, gathered[shape], n)


def _gathers(hlo):
    return collections.Counter(tuple(int(d) for d in m.group(1).split(",") if d)
                               for m in re.finditer(r"= f32\[([\d,]*)\]\S* all-gather\(", hlo))


class _XW(nn.Module):
    """``(x @ w).square().mean()``: ``w``'s gradient is one matmul, ``x.t() @ dy``, in ``w``'s shape."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 32) * 0.1)

    def forward(self, x):
        return (x @ self.w).square().mean()


def test_gradient_is_held_to_the_parameter_layout_against_a_split_activation(dev, monkeypatch):
    """A plan that computes ``w``'s gradient matmul split on its columns but keeps ``w`` replicated
    (the solver picks such plans when gathering the gradient is cheap): the optimizer still runs
    replicated, so no all-gather of ``w``'s shape (the parameter's or a moment's) is left."""
    real, edited = autoshard.solve, []

    def solve(graph, *args, **kwargs):
        plan = real(graph, *args, **kwargs)
        wid = next(n.id for n in graph.nodes if n.name == "w")
        grad = graph.nodes[graph.grads[wid][0]]
        assert grad.op == "aten.mm.default" and all(p == "R" for p in plan.placements["w"])
        edited.append(grad.name)
        return dataclasses.replace(plan, activations={**plan.activations, grad.name: ("R", ("S", 1))})

    monkeypatch.setattr(autoshard, "solve", solve)
    torch.manual_seed(0)
    model = _XW()
    xs_ = [torch.randn(8, 16) for _ in range(STEPS)]
    ref_model, ref = copy.deepcopy(model), []
    opt = torch.optim.AdamW(ref_model.parameters(), lr=1e-2)
    for x in xs_:
        loss = ref_model(x)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref.append(loss.item())
    auto = xs.distribute_module(model, Mesh(range(8), (2, 4), ("data", "model")),
                                partition_fn=xs.AutoPolicy(topology="cpu", cache_dir=False))
    opt, got = torch.optim.AdamW(auto.parameters(), lr=1e-2), []
    for x in xs_:
        loss = auto(x.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        got.append(loss.item())
    assert edited
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert _gathers(xs.last_compiled_hlo())[(16, 32)] == 0


def test_multi_output_ops_map_each_output_to_its_getitem(dev):
    """graph_from_ir_with_nodes maps output i of a multi-output op (layer norm) to the IR getitem i."""
    torch.manual_seed(0)
    ln = torch.nn.LayerNorm(8).to(dev)
    opt = torch.optim.SGD(ln.parameters(), lr=0.1)
    ln(torch.randn(4, 8).to(dev)).sum().backward()
    opt.step()
    params, state = step_roles(ln, opt)
    graph, ir_of = graph_from_ir_with_nodes(params=params, opt_state=state)
    opt.zero_grad()
    xla_dtensor.sync()
    multi = [n for n in graph.nodes if len(n.outputs) > 1 and n.op.startswith("aten.native_layer_norm")]
    assert {n.op for n in multi} == {"aten.native_layer_norm.default", "aten.native_layer_norm_backward.default"}
    for n in multi:
        for i, meta in enumerate(n.outputs):
            node = ir_of.get((n.id, i))
            if node is None:
                continue  # an output nothing reads (no getitem recorded)
            assert node.op == GETITEM and node.key[1] == i
            assert str(node.inputs[0].op) == n.op
    forward = next(n for n in multi if n.op == "aten.native_layer_norm.default")
    assert (forward.id, 0) in ir_of  # the normalized output is read
