"""Models and the training loop the fused-attention tests share: HF GPT-2 in either attention
form, Megatron TP on a 2x4 mesh, and SGD steps that count the fused attention ops recorded."""
from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import xla_dtensor
from benchmarks.models.torchvision_shim import install as _torchvision_shim
from xla_dtensor import metrics
from xla_dtensor.spmd.plans import megatron_plan

DEV = xla_dtensor.device()
COLWISE, ROWWISE = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.c_fc"), ("attn.c_proj", "mlp.c_proj")
Loss = Callable[[torch.nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]


def hf_gpt2(layers: int, attn_implementation: str) -> torch.nn.Module:
    """transformers' GPT2LMHeadModel, tiny, dropout 0, random weights."""
    _torchvision_shim()  # transformers imports torchvision, whose C++ ops do not load on CPU torch
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=layers, n_head=4,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  attn_implementation=attn_implementation)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg)


def hf_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(input_ids=x, labels=y).loss


def gpt_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return model(x, y)


def tp_2x4(model: torch.nn.Module, gpt_layers: int | None = None) -> torch.nn.Module:
    """Megatron TP over the model axis of a 2x4 mesh: the project's GPT (``gpt_layers`` blocks) or a HF model."""
    mesh = DeviceMesh("xla", torch.arange(8).reshape(2, 4), mesh_dim_names=("data", "model"))
    if gpt_layers is None:
        plan = megatron_plan(model)
    else:
        plan = {f"h.{i}.{m}": ColwiseParallel() for i in range(gpt_layers) for m in COLWISE}
        plan.update({f"h.{i}.{m}": RowwiseParallel() for i in range(gpt_layers) for m in ROWWISE})
    return parallelize_module(model, mesh["model"], plan)


def cpu_losses(model: torch.nn.Module, loss_of: Loss, batches: Sequence) -> list[float]:
    """Losses of SGD steps in torch CPU eager (the oracle)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = []
    for x, y in batches:
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    return out


def device_losses(model: torch.nn.Module, loss_of: Loss, batches: Sequence, mode: str,
                  shard: Callable[[torch.nn.Module], torch.nn.Module] | None = None) -> tuple[list[float], list[int]]:
    """The same SGD steps on the device (``mode``: "lazy" or "compile"), and the fused attention
    ops each call recorded."""
    model = copy.deepcopy(model).to(DEV)
    if shard is not None:
        model = shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    run = xla_dtensor.compile(step) if mode == "compile" else step
    got, counts = [], []
    for x, y in batches:
        before = metrics.counters()["fused_attention"]
        loss = run(x.to(DEV), y.to(DEV))
        xla_dtensor.sync()
        counts.append(metrics.counters()["fused_attention"] - before)
        got.append(loss.item())
    return got, counts
