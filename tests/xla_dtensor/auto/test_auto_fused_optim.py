"""AUTO with a fused optimizer (``AdamW(fused=True)``): the same plan as the multi-tensor AdamW, CPU's losses.

Oracles: the plan AUTO makes for the same model with torch's foreach AdamW (the two
optimizers compute the same update), and torch CPU's fused AdamW (losses).
"""
from __future__ import annotations

import copy
import warnings

import torch
from torch import nn

import xla_dtensor
import xla_dtensor.spmd as xs
from mesh import Mesh
from tests._train import train

STEPS = 3


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32), nn.GELU(), nn.Linear(32, 8))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(16, 32, generator=g), torch.randn(16, 8, generator=g)) for _ in range(STEPS)]


def _run(model: nn.Module, fused: bool, dev: torch.device | None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, fused=fused, foreach=None if fused else True)
    loss_fn = nn.MSELoss()
    return train(lambda x, y: loss_fn(model(x), y), _batches(), opt, put=(lambda t: t.to(dev)) if dev is not None else None,
                 sync=xla_dtensor.sync if dev is not None else None)


def test_auto_plans_fused_adamw_like_foreach_and_trains_like_cpu(dev) -> None:
    ref = _run(_mlp(), True, None)
    mesh = Mesh(range(8), (2, 4), ("data", "model"))
    plans = {}
    for fused in (False, True):
        auto = xs.distribute_module(copy.deepcopy(_mlp()), mesh,
                                    partition_fn=xs.AutoPolicy(topology="cpu", cache_dir=False))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            losses = _run(auto, fused, dev)
        plans[fused] = xs.last_plan().placements
        if fused:
            torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-4, atol=1e-6)
    # fused AdamW keeps its step counters on the device (0-d state the plan replicates); foreach's are on the host
    steps = {k: v for k, v in plans[True].items() if k.startswith("step:")}
    assert steps and all(set(v) == {"R"} for v in steps.values())
    assert {k: v for k, v in plans[True].items() if k not in steps} == plans[False]
    assert any(any(s != "R" for s in p) for p in plans[True].values())  # the plan shards something
