"""Meta in, shards out (issue 36): a model built on the ``meta`` device, laid out (TP, FSDP-style,
AUTO), allocated shard by shard by ``to_empty``, initialized or loaded, trains like torch CPU.

The oracle is torch CPU eager: the same seeded model (built on CPU) and batches, 3 AdamW steps,
losses equal at rtol 1e-3 (the integration matrix's tolerance). Host memory: a subprocess
measures the peak RSS growth of ``to_empty`` + init + ``sync()`` of a ~64 MB model against its
parameter bytes, and the same figure for the whole-tensor path (CPU init, then
``distribute_tensor``) as the control the bound must catch.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.distributed.tensor import DTensor

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models.zoo import ZOO
from mesh import Mesh
from xla_dtensor.spmd.errors import MetaParameterError

STEPS = 3
ROOT = Path(__file__).resolve().parents[3]


def _adamw(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def _train(zm, model: nn.Module, put) -> list[float]:
    opt = _adamw(model)
    losses = []
    for i in range(STEPS):
        loss = zm.loss(model, tuple(put(t) for t in zm.batch(i)))
        loss.backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        losses.append(float(loss.item()))
    return losses


@pytest.fixture(scope="module")
def reference() -> dict[str, tuple[dict[str, torch.Tensor], list[float]]]:
    """Per model: the seeded CPU model's state dict (before training) and its CPU losses."""
    out = {}
    for name in ("hf-llama", "hf-gpt2"):
        zm = ZOO[name]
        model = zm.build()
        sd = {k: v.clone() for k, v in model.state_dict().items()}
        out[name] = (sd, _train(zm, model, lambda t: t))
    return out


def _meta_model(zm) -> nn.Module:
    with torch.device("meta"):
        model = zm.build()
    assert all(p.is_meta for p in model.parameters())
    return model


def _layout(zm, model: nn.Module, mode: str):
    """Apply ``mode`` to the meta model; returns the batch placement function."""
    dev = xla_dtensor.device()
    mesh = xs.init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))

    def put(t: torch.Tensor) -> torch.Tensor:
        return xs.mark_sharding(t.to(dev), mesh, ("dp",) + (None,) * (t.dim() - 1)).global_tensor
    if mode in ("tp", "tp-sp"):
        from torch.distributed.tensor.parallel import parallelize_module
        parallelize_module(model, mesh["tp"], zm.tp_plan(model, mode == "tp-sp"))
        xla_dtensor.distribute_module(model, mesh)  # replicate what the plan did not place
        return put
    if mode == "fsdp":
        from xla_dtensor.fsdp import shard_model
        shard_model(model, Mesh(range(8), (2, 4), ("dp", "fsdp")), "fsdp")
        return put
    assert mode == "auto"
    xs.distribute_module(model, Mesh(range(8), (2, 4), ("dp", "tp")), partition_fn=xs.AutoPolicy(time_limit=20))
    return lambda t: t.to(dev)


CASES = [("hf-llama", "tp-sp"), ("hf-llama", "fsdp"), ("hf-llama", "auto"), ("hf-gpt2", "tp"), ("hf-gpt2", "fsdp")]


@pytest.mark.parametrize("name,mode", CASES, ids=[f"{n}-{m}" for n, m in CASES])
def test_meta_layout_to_empty_load_trains_like_cpu(reference, name: str, mode: str) -> None:
    zm = ZOO[name]
    sd, ref = reference[name]
    model = _meta_model(zm)
    put = _layout(zm, model, mode)
    sharded = [(n, p) for n, p in model.named_parameters()]
    if mode != "auto":
        assert all(isinstance(p, DTensor) and p.is_meta for _, p in sharded), [n for n, p in sharded]
        assert any(any(not pl.is_replicate() for pl in p.placements) for _, p in sharded)
    with pytest.raises(MetaParameterError, match="to_empty"):
        zm.loss(model, tuple(put(t) for t in zm.batch(0)))
    model.to_empty(device=xla_dtensor.device())
    layouts = {n: tuple(p.placements) for n, p in model.named_parameters()}
    model.init_weights()  # HF's own init (also recomputes the rotary buffers, which no state dict holds)
    model.load_state_dict(sd)
    for n, p in model.named_parameters():
        assert isinstance(p, DTensor) and p.device.type == "jax", n
        if mode != "auto":
            assert tuple(p.placements) == layouts[n], n  # init and load keep the layout
    losses = _train(zm, model, put)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-3, atol=0)
    if mode == "auto":
        plan = model._auto_plan
        assert any(any(s != "R" for s in plan.placements[n]) for n, _ in model.named_parameters()
                   if n in plan.placements) or any(any(s != "R" for s in v) for k, v in plan.placements.items()
                                                   if k.startswith("input:"))
