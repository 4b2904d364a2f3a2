"""F.scaled_dot_product_attention in eager mode: torch CPU's fused-kernel choice, CPU's results."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core.tensor import value_of

FLASH = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _run(dev, make_kwargs, kv_len=5, ctx=None, eager=True):
    """SDPA forward + backward on CPU and on the device; returns the device forward's op count (eager)
    or the op producing its output (lazy)."""
    shape = (2, 3, 5, 4)
    torch.manual_seed(0)
    q = torch.randn(*shape, requires_grad=True)
    k = torch.randn(*shape[:2], kv_len, shape[3], requires_grad=True)
    v = torch.randn(*shape[:2], kv_len, shape[3], requires_grad=True)
    w = torch.randn(*shape)
    qd, kd, vd = (t.detach().to(dev).requires_grad_() for t in (q, k, v))
    xla_dtensor.eager_mode(eager)
    try:
        with ctx or contextlib.nullcontext():
            out_cpu = F.scaled_dot_product_attention(q, k, v, **make_kwargs("cpu"))
            before = metrics.snapshot()
            out_dev = F.scaled_dot_product_attention(qd, kd, vd, **make_kwargs(dev))
        n = metrics.diff(before)["eager_ops"]
        node = value_of(out_dev)
        producer = str(node.inputs[0].op if node.op == "getitem" else node.op)
        (out_dev * w.to(dev)).sum().backward()
    finally:
        xla_dtensor.eager_mode(False)
    (out_cpu * w).sum().backward()
    torch.testing.assert_close(out_dev.cpu(), out_cpu.detach(), rtol=1e-5, atol=1e-5)
    for a, b in zip((qd, kd, vd), (q, k, v)):
        torch.testing.assert_close(a.grad.cpu(), b.grad, rtol=1e-4, atol=1e-5)
    return n if eager else producer


@pytest.mark.parametrize("causal", [False, True])
def test_eager_plain_sdpa_is_one_fused_op_and_matches_cpu(dev, causal):
    assert _run(dev, lambda d: {"is_causal": causal}) <= 2  # the fused op (+ autograd saving a detached output)


def test_eager_scaled_non_square_sdpa_is_one_fused_op_and_matches_cpu(dev):
    assert _run(dev, lambda d: {"scale": 0.3}, kv_len=7) <= 2


def test_eager_masked_sdpa_keeps_the_decomposition_and_matches_cpu(dev):
    mask = torch.rand(5, 5) > 0.3
    mask[:, 0] = True
    assert _run(dev, lambda d: {"attn_mask": mask.to(d)}) > 5


def test_eager_flash_disabled_keeps_the_decomposition_and_matches_cpu(dev):
    assert _run(dev, lambda d: {"is_causal": True}, ctx=sdpa_kernel([SDPBackend.MATH])) > 5


def test_lazy_mode_keeps_the_decomposition_and_matches_cpu(dev):
    producer = _run(dev, lambda d: {"is_causal": True}, eager=False)
    assert producer not in (FLASH, "data")


def test_compile_inside_eager_mode_traces_the_decomposition(dev):
    torch.manual_seed(0)
    q = torch.randn(1, 2, 4, 8)
    f = xla_dtensor.compile(lambda a: F.scaled_dot_product_attention(a, a, a, is_causal=True))
    xla_dtensor.eager_mode(True)
    try:
        before = metrics.snapshot()
        out = f(q.to(dev))
        assert metrics.diff(before)["eager_ops"] == 0  # traced lazily, as outside eager mode
    finally:
        xla_dtensor.eager_mode(False)
    torch.testing.assert_close(out.cpu(), F.scaled_dot_product_attention(q, q, q, is_causal=True),
                               rtol=1e-5, atol=1e-6)
