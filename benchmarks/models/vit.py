"""A ViT-style image classifier: linear patch embedding, cls token, pre-LN transformer blocks, linear head.

Patches are cut by reshape/permute and embedded with a Linear (the same map as a
stride-``patch`` Conv2d).

Example:
    >>> cfg = ViTConfig(image_size=8, patch_size=4, dim=16, n_layers=1, n_heads=2, mlp_dim=32)
    >>> ViT(cfg)(*make_batch(cfg, 2)).shape
    torch.Size([])
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class ViTConfig:
    """Sizes; the defaults are tiny (tests); ViT-B/16 is (224, 16, 3, 768, 12, 12, 3072, 1000)."""

    image_size: int = 16
    patch_size: int = 4
    channels: int = 3
    dim: int = 32
    n_layers: int = 2
    n_heads: int = 4
    mlp_dim: int = 64
    num_classes: int = 10

    def __post_init__(self) -> None:
        if self.image_size % self.patch_size:
            raise ValueError(f"image_size={self.image_size} is not a multiple of patch_size={self.patch_size}")
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} must be divisible by n_heads={self.n_heads}")

    @property
    def num_patches(self) -> int:
        return (self.image_size // self.patch_size) ** 2


class Attention(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.dim, 3 * cfg.dim)
        self.proj = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4).unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(cfg.dim), Attention(cfg)
        self.norm2 = nn.LayerNorm(cfg.dim)
        self.mlp = nn.Sequential(nn.Linear(cfg.dim, cfg.mlp_dim), nn.GELU(), nn.Linear(cfg.mlp_dim, cfg.dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    """See the module docstring; ``forward(images, labels)`` returns the mean cross-entropy."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.patch_embed = nn.Linear(cfg.channels * cfg.patch_size ** 2, cfg.dim)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.dim))
        self.pos_embed = nn.Parameter(torch.randn(1, cfg.num_patches + 1, cfg.dim) * 0.02)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.num_classes)

    def patches(self, images: torch.Tensor) -> torch.Tensor:
        """``(B, C, H, W)`` -> ``(B, num_patches, C * patch * patch)``."""
        b, c, h, w = images.shape
        p = self.cfg.patch_size
        x = images.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(b, (h // p) * (w // p), c * p * p)

    def forward(self, images: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.patch_embed(self.patches(images))
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.norm(x)[:, 0])
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


def make_batch(cfg: ViTConfig, batch_size: int, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Random images ``(batch_size, channels, image_size, image_size)`` and class labels."""
    images = torch.randn(batch_size, cfg.channels, cfg.image_size, cfg.image_size, generator=generator)
    return images, torch.randint(0, cfg.num_classes, (batch_size,), generator=generator)
