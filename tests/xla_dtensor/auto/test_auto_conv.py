"""AUTO on a ResNet-style CNN (convolutions, BatchNorm with its 0-d ``num_batches_tracked``): trains like CPU."""
from __future__ import annotations

import copy

import torch
from torch import nn

import xla_dtensor
import xla_dtensor.spmd as xs
from tests._train import train


class _Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem, self.bn = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.block, self.fc = _Block(8), nn.Linear(8, 10)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        h = self.block(torch.relu(self.bn(self.stem(x))))
        return nn.functional.cross_entropy(self.fc(nn.functional.adaptive_avg_pool2d(h, 1).flatten(1)), y)


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [(torch.randn(16, 3, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)) for _ in range(3)]


def test_batchnorm_cnn_trains_under_auto_with_replicated_0d_buffers(dev):
    torch.manual_seed(0)
    base = _Net()
    ref_model = copy.deepcopy(base)
    ref = train(ref_model, _batches(), torch.optim.AdamW(ref_model.parameters(), lr=1e-2))
    m = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model = xs.distribute_module(copy.deepcopy(base), m, partition_fn=xs.AutoPolicy(time_limit=20, topology="tpu-v5e"))
    got = train(model, _batches(), torch.optim.AdamW(model.parameters(), lr=1e-2), put=lambda t: t.to(dev),
                sync=xla_dtensor.sync)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-5)
    assert model._auto_plan.stats["unknown_ops"] == []
    tracked = model.bn.num_batches_tracked
    assert tracked.dim() == 0 and int(tracked.cpu()) == int(ref_model.bn.num_batches_tracked) == 3
    torch.testing.assert_close(model.block.bn2.running_var.cpu(), ref_model.block.bn2.running_var, rtol=1e-3, atol=1e-5)
