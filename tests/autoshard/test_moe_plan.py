"""AUTO finds expert parallelism on an MoE layer when it pays, and data parallelism when it does not.

The layer is GShard's dispatch/combine form (top-1 routing with a one-hot dispatch mask,
the experts as one batched matmul over the expert dim), traced with fake tensors. Hand
reasoning on the TPU v5e and H100 models: with few tokens and large experts, the expert
weights' gradient reductions dominate data parallelism, while splitting the experts
needs only the tokens gathered and the combined output reduced, so the expert dim of
both expert weights must be split; with many tokens and small experts, data
parallelism's split of the tokens wins and the experts stay whole.
"""
from __future__ import annotations

import mesh  # noqa: F401

import warnings

import pytest
import torch
from mesh import Mesh, topology_for
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from autoshard.api import solve
from autoshard.fx_builder import trace_training_step


class _MoE(nn.Module):
    def __init__(self, hidden: int, ffn: int, experts: int) -> None:
        super().__init__()
        self.router = nn.Linear(hidden, experts, bias=False)
        self.w1 = nn.Parameter(torch.randn(experts, hidden, ffn) * 0.02)
        self.w2 = nn.Parameter(torch.randn(experts, ffn, hidden) * 0.02)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.router(x), -1)                                 # [T, E]
        top = probs.topk(1, dim=-1).indices.squeeze(-1)
        gate = (nn.functional.one_hot(top, probs.shape[-1]).to(x.dtype) * probs).t().unsqueeze(-1)  # [E, T, 1]
        out = torch.bmm(torch.relu(torch.bmm(gate * x.unsqueeze(0), self.w1)), self.w2)  # experts: [E, T, H]
        return (((out * gate).sum(0) - y) ** 2).mean()                           # combine [T, H]


def _graph(tokens: int, hidden: int, ffn: int):
    with FakeTensorMode():
        model, batch = _MoE(hidden, ffn, 8), (torch.zeros(tokens, hidden), torch.zeros(tokens, hidden))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return trace_training_step(model, batch, name=f"moe{tokens}x{hidden}x{ffn}")


@pytest.fixture(scope="module")
def big_experts():
    return _graph(256, 1024, 4096)


@pytest.mark.parametrize("shape", [(1, 8), (2, 4)])
@pytest.mark.parametrize("topo", ["tpu-v5e", "h100"])
def test_large_experts_few_tokens_get_expert_parallelism(big_experts, shape, topo):
    m = Mesh(range(8), shape, ("data", "model"))
    plan = solve(big_experts, m, topology_for(m, topo), time_limit=60, cache=False)
    for w in ("w1", "w2"):
        split = [a for a, p in enumerate(plan.placements[w]) if p == ("S", 0) and shape[a] > 1]
        assert split, plan.explain()  # the expert dim, over a mesh axis of more than one device
    assert plan.objective < 0.5 * plan.best_baseline()[1]  # every manual baseline keeps the experts whole or FSDP


def test_many_tokens_small_experts_stay_data_parallel():
    m = Mesh(range(8), (1, 8), ("data", "model"))
    plan = solve(_graph(16384, 64, 128), m, topology_for(m, "tpu-v5e"), time_limit=60, cache=False)
    assert plan.placements["input0"][1] == ("S", 0)  # the tokens over the 8 devices (the data axis has size 1)
    assert all(p == "R" for w in ("w1", "w2", "router.weight") for p in plan.placements[w][1:])
    assert plan.objective <= plan.baselines["data_parallel"]["cost"] * (1 + 1e-9)
