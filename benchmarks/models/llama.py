"""A Llama-style decoder in plain torch.nn: RMSNorm, rotary embeddings, causal SDPA, SwiGLU, no biases.

``forward(idx, targets)`` returns the mean next-token cross-entropy.

Example:
    >>> import torch
    >>> cfg = LlamaConfig(vocab=64, dim=32, n_layers=1, n_heads=4, hidden_dim=48, max_seq=16)
    >>> model = Llama(cfg)
    >>> model(*make_batch(cfg, 2)).shape
    torch.Size([])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaConfig:
    """Model sizes; the defaults are tiny (tests); Llama-2 7B is (32000, 4096, 32, 32, 11008, 4096)."""

    vocab: int = 256
    dim: int = 64
    n_layers: int = 2
    n_heads: int = 4
    hidden_dim: int = 176
    max_seq: int = 64
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"dim={self.dim} must split into n_heads={self.n_heads} heads of even size")


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary_tables(head_dim: int, seq: int, theta: float, device: torch.device | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos, sin`` of shape ``(seq, head_dim)`` (each frequency repeated for both halves)."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    ang = torch.outer(torch.arange(seq, dtype=torch.float32, device=device), inv)
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` (batch, heads, seq, head_dim) by position (the "rotate half" form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.wq = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.dim, bias=False)
        self.wo = nn.Linear(cfg.dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = lambda y: y.view(b, t, self.n_heads, c // self.n_heads).transpose(1, 2)  # noqa: E731
        q = apply_rotary(heads(self.wq(x)), cos, sin)
        k = apply_rotary(heads(self.wk(x)), cos, sin)
        y = F.scaled_dot_product_attention(q, k, heads(self.wv(x)), is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, c))


class FeedForward(nn.Module):
    """SwiGLU: ``w2(silu(w1 x) * w3 x)``."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)
        self.w2 = nn.Linear(cfg.hidden_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm, self.attention = RMSNorm(cfg.dim, cfg.norm_eps), Attention(cfg)
        self.ffn_norm, self.feed_forward = RMSNorm(cfg.dim, cfg.norm_eps), FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Llama-style language model; see the module docstring."""

    def __init__(self, cfg: LlamaConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.max_seq:
            raise ValueError(f"sequence length {t} exceeds max_seq={self.cfg.max_seq}")
        # NOTE: tables are computed in the step, not held as buffers: make_fx drops buffer inputs
        cos, sin = rotary_tables(self.cfg.dim // self.cfg.n_heads, t, self.cfg.rope_theta, idx.device)
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.output(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def make_batch(cfg: LlamaConfig, batch_size: int, seq: int | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and next-token targets, each ``(batch_size, seq)`` (seq: ``max_seq``)."""
    seq = cfg.max_seq if seq is None else seq
    ids = torch.randint(0, cfg.vocab, (batch_size, seq + 1), generator=generator)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
