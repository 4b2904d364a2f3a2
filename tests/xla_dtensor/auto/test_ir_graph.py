"""The lazy IR of a training step, as an autoshard graph, against the make_fx graph of the same step.

Oracle: :func:`autoshard.trace_training_step` (make_fx, with SDPA's math backend so both
paths see the same attention ops) and ``p.grad`` read before ``zero_grad``.
"""
from __future__ import annotations

import collections
import copy
import warnings

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

import autoshard
import xla_dtensor
from autoshard.build import node_strategies
from benchmarks.models import GPT2, GPT2Config
from mesh import Mesh, topology_for
from xla_dtensor.auto import graph_from_ir, pending_storages, step_roles
from xla_dtensor.core.ir import DATA

MM = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default")
MESH = Mesh(range(8), (2, 4), ("data", "model"))
TOPO = topology_for(MESH, "tpu-v5e")


def _batch():
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, 64, (8, 8), generator=g), torch.randint(0, 64, (8, 8), generator=g)


def _lazy_step(model, opt, idx, tgt, dev):
    """One step recorded lazily; returns (graph, explicit grads, pending roots count)."""
    i, t = idx.to(dev), tgt.to(dev)
    loss = model(i, t)
    loss.backward()
    opt.step()
    grads = {n: p.grad for n, p in model.named_parameters()}
    params, state = step_roles(model, opt)
    assert pending_storages(), "the step must still be pending"
    g = graph_from_ir(params=params, opt_state=state, inputs={i: "input0", t: "input1"}, name="GPT2")
    explicit = graph_from_ir(params=params, opt_state=state, inputs={i: "input0", t: "input1"}, grads=grads)
    opt.zero_grad()
    return g, explicit, loss


@pytest.fixture(scope="module")
def graphs(dev):
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=2))
    idx, tgt = _batch()
    with sdpa_kernel(SDPBackend.MATH):
        fx = autoshard.trace_training_step(copy.deepcopy(model), (idx, tgt))
    m = model.to(dev)
    xla_dtensor.sync()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.01, foreach=True)
    # NOTE: the fx trace decomposes SDPA (the math backend) and F.linear: so does the lazy step here, not the
    # fused ops; a third step records F.linear as one op (xla_dtensor.linear), for its rule's flops
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setattr(xla_dtensor.config, "fused_attention", False)
    monkeypatch.setattr(xla_dtensor.config, "fused_linear", False)
    try:
        first, first_explicit, _ = _lazy_step(m, opt, idx, tgt, dev)  # optimizer state created inside the step
        xla_dtensor.sync()
        second, second_explicit, _ = _lazy_step(m, opt, idx, tgt, dev)  # state held as device data
        xla_dtensor.sync()
        monkeypatch.setattr(xla_dtensor.config, "fused_linear", True)
        fused, fused_explicit, _ = _lazy_step(m, opt, idx, tgt, dev)
        xla_dtensor.sync()
    finally:
        monkeypatch.undo()
    names = [n for n, _ in m.named_parameters()]
    return fx, {"first": (first, first_explicit), "second": (second, second_explicit),
                "fused linear": (fused, fused_explicit)}, names


def _by_role(g, role):
    return {n.name: n.out.shape for n in g.nodes if n.role == role}


def _flops(g):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rules = node_strategies(g, TOPO)[0]
    return sum(r.flops for r in rules)


@pytest.mark.parametrize("step", ["first", "second"])
def test_structure_matches_fx(graphs, step):
    fx, ir, names = graphs
    g, _ = ir[step]
    assert _by_role(g, "param") == _by_role(fx, "param")
    assert set(_by_role(g, "param")) == set(names)
    assert _by_role(g, "opt_state") == _by_role(fx, "opt_state")
    assert _by_role(g, "input") == _by_role(fx, "input")
    count = lambda gr: collections.Counter(n.op for n in gr.nodes if n.op in MM)  # noqa: E731
    assert count(g) == count(fx)
    assert _flops(g) == pytest.approx(_flops(fx), rel=0.01)


def test_fused_linear_has_the_flops_of_torch_decomposition(graphs):
    """With F.linear recorded as one op, the matmul flops AUTO costs equal the fx trace's
    (its addmm / mm of the same layers): the rule in autoshard/strategies/matmul.py."""
    fx, ir, _ = graphs
    g, _ = ir["fused linear"]
    linears = [n for n in g.nodes if n.op == "xla_dtensor.linear.default"]
    assert len(linears) == 2 * 6 + 1  # 2 layers x (q, k, v, attention and MLP projections) and the LM head
    assert not [n for n in g.nodes if n.op == "aten.addmm.default"]
    assert _flops(g) == pytest.approx(_flops(fx), rel=0.01)


@pytest.mark.parametrize("step", ["first", "second"])
def test_aliases_and_grads_match_fx(graphs, step):
    fx, ir, _ = graphs
    g, explicit = ir[step]

    def groups(gr):
        out = {}
        for grp in gr.alias_groups:
            ph = sorted(gr.nodes[v].name for v in grp if gr.nodes[v].op == "placeholder")
            ops = sorted(gr.nodes[v].op for v in grp if gr.nodes[v].op != "placeholder")
            out[ph[0]] = (ph, ops)
        return out

    gi, gf = groups(g), groups(fx)
    assert {k: v[0] for k, v in gi.items()} == {k: v[0] for k, v in gf.items()}
    for k, (_, ops) in gi.items():  # the same in-place updates, fx names them per element too
        assert len(ops) == len(gf[k][1]), (k, ops, gf[k][1])
    name = {v: g.nodes[v].name for v in g.param_ids()}
    grad_of = lambda gr: {gr.nodes[p].name: (gr.nodes[r[0]].op, gr.nodes[r[0]].outputs[r[1]].shape)  # noqa: E731
                          for p, r in gr.grads.items()}
    assert set(name.values()) == set(grad_of(g))
    assert g.grads == explicit.grads  # the inferred gradient is the tensor p.grad held
    assert {k: v[1] for k, v in grad_of(g).items()} == {k: v[1] for k, v in grad_of(fx).items()}


def test_plans_match_fx_on_2x4_mesh(graphs):
    fx, ir, names = graphs
    g, _ = ir["second"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", autoshard.UnknownOpWarning)
        pf = autoshard.solve(fx, MESH, TOPO, time_limit=30)
        pi = autoshard.solve(g, MESH, TOPO, time_limit=30)
    assert {n: pi.placements[n] for n in names} == {n: pf.placements[n] for n in names}
    assert pi.objective == pytest.approx(pf.objective, rel=0.1)


def test_single_tensor_adamw_and_leaves(dev):
    """Non-foreach AdamW records one in-place op per tensor; roles and aliases still come out."""
    torch.manual_seed(1)
    lin = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).to(dev)
    xla_dtensor.sync()
    opt = torch.optim.AdamW(lin.parameters(), lr=1e-2, foreach=False)
    x = torch.randn(4, 8).to(dev)
    lin(x).square().mean().backward()
    opt.step()
    params, state = step_roles(lin, opt)
    grads = {n: p.grad for n, p in lin.named_parameters()}
    g = graph_from_ir(params=params, opt_state=state)
    assert _by_role(g, "param") == {n: tuple(p.shape) for n, p in lin.named_parameters()}
    assert _by_role(g, "input") == {"input0": (4, 8)}
    assert g.grads == graph_from_ir(params=params, opt_state=state, grads=grads).grads
    assert len(g.grads) == 4
    for grp in g.alias_groups:  # param, exp_avg, exp_avg_sq and at least one update of each
        roles = collections.Counter(g.nodes[v].role for v in grp if g.nodes[v].op == "placeholder")
        assert roles == {"param": 1, "opt_state": 2}
        assert len(grp) >= 6
    ids = {id(s.value) for s in pending_storages()}
    assert all(n.op != DATA for n in [s.value for s in pending_storages()]) and ids
    opt.zero_grad()
    xla_dtensor.sync()
    assert not pending_storages()
