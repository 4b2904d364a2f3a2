"""A wide MLP: ``n_layers`` Linear+GELU blocks and a linear head, with a classification or regression loss.

Example:
    >>> cfg = MLPConfig(in_dim=16, hidden=32, n_layers=2, out_dim=4)
    >>> WideMLP(cfg)(*make_batch(cfg, 8)).shape
    torch.Size([])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

TASKS = ("classification", "regression")


@dataclass(frozen=True)
class MLPConfig:
    """Sizes; ``task`` picks cross-entropy over ``out_dim`` classes or mean squared error."""

    in_dim: int = 64
    hidden: int = 256
    n_layers: int = 3
    out_dim: int = 10
    task: str = "classification"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r}; allowed: {TASKS}")
        if self.n_layers < 1:
            raise ValueError(f"n_layers={self.n_layers} must be at least 1")


class WideMLP(nn.Module):
    """See the module docstring; ``forward(x, targets)`` returns the loss, ``forward(x)`` the outputs."""

    def __init__(self, cfg: MLPConfig) -> None:
        super().__init__()
        self.cfg = cfg
        dims = [cfg.in_dim] + [cfg.hidden] * cfg.n_layers
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims, dims[1:]))
        self.head = nn.Linear(cfg.hidden, cfg.out_dim)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            x = F.gelu(layer(x))
        out = self.head(x)
        if targets is None:
            return out
        if self.cfg.task == "classification":
            return F.cross_entropy(out, targets)
        return F.mse_loss(out, targets)


def make_batch(cfg: MLPConfig, batch_size: int, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs ``(batch_size, in_dim)`` and class ids or regression targets."""
    x = torch.randn(batch_size, cfg.in_dim, generator=generator)
    if cfg.task == "classification":
        return x, torch.randint(0, cfg.out_dim, (batch_size,), generator=generator)
    return x, torch.randn(batch_size, cfg.out_dim, generator=generator)
