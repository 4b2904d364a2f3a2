"""Optimizer state of a sticky (``mark_sharding``) parameter takes the parameter's layout, as a DTensor
parameter's state takes its placements (``spmd.annotate._state_layouts``).

Oracles: the parameter's own spec (hand-given), JAX's sharding of the state's data after the sync,
and torch CPU eager for the training losses (the project's MLP and transformers' GPT-2).
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

import xla_dtensor
import xla_dtensor.spmd as xs
from tests._train import MLP_BATCHES, mlp, sharded_batch, train
from xla_dtensor.core.tensor import value_of
from xla_dtensor.spmd.annotate import sticky_spec

DEV = xla_dtensor.device()
MESH = xs.Mesh(range(8), (2, 4), ("data", "model"))


def _state_specs(opt: torch.optim.Optimizer, p: torch.Tensor) -> dict[str, object]:
    return {k: xs.get_spec(t) for k, t in opt.state[p].items() if t.dim() > 0}


def test_adamw_state_takes_each_marked_parameters_layout_and_matches_torch_cpu() -> None:
    ref = mlp()
    want = train(lambda x, y: F.mse_loss(ref(x), y), MLP_BATCHES, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    model = mlp().to(DEV)
    marked = {model[0].weight: ("model", None), model[0].bias: ("model",), model[2].weight: (None, "model")}
    for p, spec in marked.items():
        xs.mark_sharding(p, MESH, spec)
    own = ("data", None)  # a state slot the user laid out keeps its own layout
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    got = train(lambda x, y: F.mse_loss(model(x), y), MLP_BATCHES[:1], opt,
                put=sharded_batch(MESH, DEV, ("data", None, None)), sync=xla_dtensor.sync)
    xs.mark_sharding(opt.state[model[2].weight]["exp_avg_sq"], MESH, own)
    got += train(lambda x, y: F.mse_loss(model(x), y), MLP_BATCHES[1:], opt,
                 put=sharded_batch(MESH, DEV, ("data", None, None)), sync=xla_dtensor.sync)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    for p, spec in marked.items():
        expect = xs.get_spec(p)
        assert expect.to_partition_spec() == spec
        for name, s in _state_specs(opt, p).items():
            if p is model[2].weight and name == "exp_avg_sq":
                assert s.to_partition_spec() == own
                continue
            assert s == expect, (name, s, expect)
            data = value_of(opt.state[p][name]).data  # the layout the program gave it
            assert data.sharding.is_equivalent_to(expect.to_named_sharding(), p.dim())
    # an unmarked parameter's state has no layout of its own (XLA's propagation places it)
    assert all(sticky_spec(t) is None for t in opt.state[model[2].bias].values())


def test_cpu_optimizer_state_is_left_alone() -> None:
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = MLP_BATCHES[0]
    F.mse_loss(model(x), y).backward()
    opt.step()
    assert all(t.device.type == "cpu" for st in opt.state.values() for t in st.values())


def test_hf_gpt2_marked_weights_state_follows_and_matches_torch_cpu() -> None:
    """transformers' GPT-2 (Conv1D weights, ``(in, out)``) with its MLP weights marked 2x4 Megatron."""
    from tests.xla_dtensor.ops._attention_models import hf_gpt2, hf_loss
    torch.manual_seed(1)
    batches = [(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))) for _ in range(2)]
    ref = hf_gpt2(1, "sdpa")
    want = train(lambda x, y: hf_loss(ref, x, y), batches, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    model = hf_gpt2(1, "sdpa").to(DEV)
    mlp_ = model.transformer.h[0].mlp
    xs.mark_sharding(mlp_.c_fc.weight, MESH, (None, "model"))
    xs.mark_sharding(mlp_.c_fc.bias, MESH, ("model",))
    xs.mark_sharding(mlp_.c_proj.weight, MESH, ("model", None))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    got = train(lambda x, y: hf_loss(model, x, y), batches, opt, put=lambda t: t.to(DEV), sync=xla_dtensor.sync)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for p in (mlp_.c_fc.weight, mlp_.c_fc.bias, mlp_.c_proj.weight):
        specs = _state_specs(opt, p)
        assert set(specs) == {"exp_avg", "exp_avg_sq"} and all(s == xs.get_spec(p) for s in specs.values())


def test_a_state_slot_of_another_shape_gets_no_layout() -> None:
    """A slot whose shape differs from its parameter's (a factored second moment, say) is left to XLA."""
    p = torch.nn.Parameter(torch.zeros(8, 4, device=DEV))
    xs.mark_sharding(p, MESH, ("model", None))
    opt = torch.optim.SGD([p], lr=0.1)
    opt.state[p]["exp_avg"] = torch.zeros(8, device=DEV)
    p.grad = torch.ones(8, 4, device=DEV)
    opt.step()
    xla_dtensor.sync()
    assert sticky_spec(opt.state[p]["exp_avg"]) is None
