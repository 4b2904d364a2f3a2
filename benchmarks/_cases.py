"""Models, meshes and topologies of the auto-vs-manual benchmark.

Models are small enough that a training step on 8 virtual CPU devices takes about a
tenth of a second; the modelled (real-topology) cases trace the same models with a
global batch of 2 sequences (or 8 samples) per device.

Example:
    >>> [c.name for c in MODELS][:2]
    ['gpt2-2L-128', 'gpt2-4L-256']
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from benchmarks._strategies import TPPlan
from benchmarks.models.gpt2 import GPT2, GPT2Config
from benchmarks.models.llama import Llama, LlamaConfig
from benchmarks.models.llama import make_batch as llama_batch
from benchmarks.models.mlp import MLPConfig, WideMLP
from benchmarks.models.mlp import make_batch as mlp_batch
from benchmarks.models.vit import ViT, ViTConfig
from benchmarks.models.vit import make_batch as vit_batch
from mesh import HybridMesh, Mesh, Topology
from mesh.presets import PRESETS


@dataclass(frozen=True)
class ModelCase:
    """A model builder, a batch builder (batch size -> inputs), the batch on 8 devices, its TP plan."""

    name: str
    make: Callable[[], torch.nn.Module]
    batch: Callable[[int], tuple[torch.Tensor, ...]]
    batch_size: int
    tp: TPPlan
    per_device: int  # samples per device in the real-topology cases
    meshes: tuple[str, ...] | None = None  # virtual meshes measured (None: all of them)
    ir_graph: bool = False  # plan on the lazy core's IR (what AUTO sees) instead of a make_fx trace


def _gpt2(layers: int, d: int, heads: int) -> ModelCase:
    cfg = GPT2Config(vocab=512, n_positions=64, n_embd=d, n_layer=layers, n_head=heads)

    def batch(bs: int) -> tuple[torch.Tensor, ...]:
        ids = torch.randint(0, cfg.vocab, (bs, 65), generator=torch.Generator().manual_seed(1))
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    return ModelCase(f"gpt2-{layers}L-{d}", lambda: GPT2(cfg), batch, 16,
                     TPPlan(row=r"(^|\.)c_proj\.weight$", vocab=r"^wte\."), 2)


_LLAMA = LlamaConfig(vocab=512, dim=128, n_layers=2, n_heads=4, hidden_dim=352, max_seq=64)
_VIT = ViTConfig(image_size=32, patch_size=4, dim=128, n_layers=2, n_heads=4, mlp_dim=256, num_classes=16)
_MLP = MLPConfig(in_dim=256, hidden=1024, n_layers=3, out_dim=16)


def _seeded(fn: Callable[..., Any], cfg: Any) -> Callable[[int], tuple[torch.Tensor, ...]]:
    return lambda bs: fn(cfg, bs, generator=torch.Generator().manual_seed(1))


MODELS: list[ModelCase] = [
    _gpt2(2, 128, 4),
    _gpt2(4, 256, 8),
    ModelCase("llama-2L-128", lambda: Llama(_LLAMA), _seeded(llama_batch, _LLAMA), 16,
              TPPlan(row=r"(^|\.)(wo|w2)\.weight$", vocab=r"^tok_embeddings\."), 2),
    ModelCase("mlp-3x1024", lambda: WideMLP(_MLP), _seeded(mlp_batch, _MLP), 64,
              TPPlan(row=r"layers\.[13579]\.weight$|^head\.weight$"), 8),
    ModelCase("vit-2L-128", lambda: ViT(_VIT), _seeded(vit_batch, _VIT), 16,
              TPPlan(row=r"(^|\.)(proj|mlp\.2)\.weight$", replicate=r"norm|pos_embed|cls_token|patch_embed|head"), 2),
]


def virtual_meshes() -> dict[str, Mesh]:
    """The 8-virtual-device meshes that are measured."""
    return {
        "1x8": Mesh(range(8), (1, 8), ("data", "model")),
        "2x4": Mesh(range(8), (2, 4), ("data", "model")),
        "4x2": Mesh(range(8), (4, 2), ("data", "model")),
        "2 granules x4": HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("data", "model"),
                                    num_granules=2),
    }


def real_topologies() -> dict[str, tuple[Topology, int]]:
    """Modelled systems: name -> (topology, device count)."""
    v5e, h100 = PRESETS["tpu-v5e"], PRESETS["h100"]
    return {
        "8x H100 (2x4)": (Topology(("data", "model"), (2, 4), (h100.fast, h100.fast), h100.device, "h100"), 8),
        "TPU v5e 2x4": (Topology(("data", "model"), (2, 4), (v5e.fast, v5e.fast), v5e.device, "tpu-v5e"), 8),
        "TPU v5e 4x4": (Topology(("data", "model"), (4, 4), (v5e.fast, v5e.fast), v5e.device, "tpu-v5e"), 16),
        "2x v5e-16 (DCN x ICI)": (Topology(("data", "model"), (2, 16), (v5e.slow, v5e.fast), v5e.device,
                                           "tpu-v5e"), 32),
    }
