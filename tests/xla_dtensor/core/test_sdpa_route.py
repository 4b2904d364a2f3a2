"""F.scaled_dot_product_attention on the jax device: torch CPU's fused-kernel choice, CPU's results."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from xla_dtensor.core.tensor import value_of

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _producer(t: torch.Tensor) -> str:
    n = value_of(t)
    return str(n.inputs[0].op if n.op == "getitem" else n.op)


def _run(dev, make_kwargs, shape=(2, 3, 5, 4), kv_len=5, ctx=None):
    torch.manual_seed(0)
    q = torch.randn(*shape, requires_grad=True)
    k = torch.randn(*shape[:2], kv_len, shape[3], requires_grad=True)
    v = torch.randn(*shape[:2], kv_len, shape[3], requires_grad=True)
    w = torch.randn(*shape)
    qd, kd, vd = (t.detach().to(dev).requires_grad_() for t in (q, k, v))
    with ctx or contextlib.nullcontext():
        out_cpu = F.scaled_dot_product_attention(q, k, v, **make_kwargs("cpu"))
        out_dev = F.scaled_dot_product_attention(qd, kd, vd, **make_kwargs(dev))
    producer = _producer(out_dev)  # before anything materializes it
    (out_cpu * w).sum().backward()
    (out_dev * w.to(dev)).sum().backward()
    torch.testing.assert_close(out_dev.cpu(), out_cpu.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip((qd, kd, vd), (q, k, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)
    return producer


@pytest.mark.parametrize("causal", [False, True])
def test_plain_sdpa_records_cpus_fused_op_and_matches_cpu(dev, causal):
    producer = _run(dev, lambda d: {"is_causal": causal})
    assert producer == FLASH


def test_scaled_non_square_sdpa_matches_cpu(dev):
    producer = _run(dev, lambda d: {"scale": 0.3}, kv_len=7)
    assert producer == FLASH


def test_masked_sdpa_keeps_the_decomposition_and_matches_cpu(dev):
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    producer = _run(dev, lambda d: {"attn_mask": mask.to(d)})
    assert producer != FLASH


def test_flash_disabled_keeps_the_decomposition_and_matches_cpu(dev):
    producer = _run(dev, lambda d: {"is_causal": True}, ctx=sdpa_kernel([SDPBackend.MATH]))
    assert producer != FLASH
