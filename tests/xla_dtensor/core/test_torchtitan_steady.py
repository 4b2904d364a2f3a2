"""torchtitan's Llama (complex rotary embeddings) trains like torch CPU and compiles nothing after step 2.

Its rotary path (``view_as_complex`` -> complex multiply -> ``view_as_real``, ``polar`` for
the table) once had no lowerings: with ``cpu_fallback`` every layer cut the step into
several programs (9 compiles in step 1, a 0.22 s steady step instead of 0.03 s), and
``conj`` was an identity, so the rotary gradients were wrong. Tiny dims of the debug
model; the oracle is the same model trained on torch CPU.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics

llama3 = pytest.importorskip("torchtitan.models.llama3", reason="torchtitan (the `models` extra) is not installed")

STEPS = 4


@pytest.fixture(scope="module")
def model_and_batches() -> tuple[torch.nn.Module, list]:
    torch.manual_seed(0)
    args = dataclasses.replace(llama3.llama3_args["debugmodel"], dim=32, n_layers=1, n_heads=4, vocab_size=64,
                               multiple_of=16, max_seq_len=32)
    model = llama3.Transformer(args)
    with torch.no_grad():
        model.init_weights()
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, 64, (8, 16), generator=g) for _ in range(STEPS)]
    return model, batches


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(ids)
    return torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())


def _train(model: torch.nn.Module, batches: list, dev: torch.device | None) -> tuple[list[float], list[int]]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, compiles = [], []
    for ids in batches:
        before = metrics.counters()["compiles"]
        loss = _loss(model, ids.to(dev) if dev else ids)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev:
            xla_dtensor.sync()
        losses.append(loss.item())
        compiles.append(metrics.counters()["compiles"] - before)
    return losses, compiles


@pytest.fixture(scope="module")
def cpu_losses(model_and_batches: tuple) -> list[float]:
    model, batches = model_and_batches
    return _train(copy.deepcopy(model), batches, None)[0]


@pytest.mark.parametrize("mode", ["lazy", "fsdp_1x8"])
def test_trains_like_cpu_and_compiles_nothing_after_step_2(mode: str, model_and_batches: tuple,
                                                          cpu_losses: list[float]) -> None:
    model, batches = model_and_batches
    m = copy.deepcopy(model)
    dev = xla_dtensor.device()
    if mode == "fsdp_1x8":
        from xla_dtensor.fsdp import shard_model
        shard_model(m, xla_dtensor.Mesh(range(8), (8,), ("fsdp",)))
    else:
        m.to(dev)
    fallbacks = metrics.counters()["cpu_fallbacks"]
    losses, compiles = _train(m, batches, dev)
    torch.testing.assert_close(losses, cpu_losses, rtol=1e-3, atol=0)
    assert compiles[2:] == [0] * (STEPS - 2), compiles
    assert metrics.counters()["cpu_fallbacks"] == fallbacks
