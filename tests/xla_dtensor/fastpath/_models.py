"""Shared tiny GPT-2 setup for the fast-path tests."""
from __future__ import annotations

import torch

from benchmarks.models import GPT2, GPT2Config

CFG = GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)


def tiny_gpt2() -> GPT2:
    torch.manual_seed(0)
    return GPT2(CFG)


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, 64, (2, 16), generator=g), torch.randint(0, 64, (2, 16), generator=g))
            for _ in range(n)]


def adamw(params):
    return torch.optim.AdamW(params, lr=3e-3, weight_decay=0.1)


def cpu_losses(model, bs, opt_fn=adamw) -> list[float]:
    opt = opt_fn(model.parameters())
    return [train_step(model, opt, x, y).item() for x, y in bs]


def train_step(model, opt, x, y):
    """One training step as a function of its inputs: what ``xla_dtensor.compile`` traces."""
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss
