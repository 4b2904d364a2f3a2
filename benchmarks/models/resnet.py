"""A small ResNet-style conv net (conv-BN-ReLU stem, residual basic blocks, pooled linear head).

Example:
    >>> import torch
    >>> net = ResNet(ResNetConfig(channels=(8, 16), num_classes=10))
    >>> net(torch.randn(2, 3, 16, 16)).shape
    torch.Size([2, 10])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ResNetConfig:
    """Widths of the stages (each stage after the first halves the resolution)."""

    in_channels: int = 3
    channels: tuple[int, ...] = (16, 32, 64)
    num_classes: int = 10
    norm: str = "batch"  # "batch" or "group"


def _norm(kind: str, c: int) -> nn.Module:
    if kind == "batch":
        return nn.BatchNorm2d(c)
    if kind == "group":
        return nn.GroupNorm(min(4, c), c)
    raise ValueError(f"norm must be 'batch' or 'group', got {kind!r}")


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, norm: str) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = _norm(norm, cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = _norm(norm, cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), _norm(norm, cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class ResNet(nn.Module):
    """See the module docstring."""

    def __init__(self, cfg: ResNetConfig = ResNetConfig()) -> None:
        super().__init__()
        c0 = cfg.channels[0]
        self.stem = nn.Sequential(nn.Conv2d(cfg.in_channels, c0, 3, 1, 1, bias=False), _norm(cfg.norm, c0), nn.ReLU())
        blocks, cin = [], c0
        for i, c in enumerate(cfg.channels):
            blocks.append(BasicBlock(cin, c, 1 if i == 0 else 2, cfg.norm))
            cin = c
        self.blocks = nn.Sequential(*blocks)
        self.head = nn.Linear(cin, cfg.num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.blocks(self.stem(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))
