"""The hand-written attention pattern (``softmax(q @ kᵀ * scale + mask) @ v``) as the fused
attention op: numerics of single patterns against torch CPU, patterns that must stay
unfused, and models (a hand-written GPT, HF GPT-2 with eager attention) on one device and
under 2x4 TP, in lazy mode and under ``xla_dtensor.compile``, against CPU training."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from benchmarks.models import GPT2, GPT2Config
from benchmarks.models.gpt2 import Attention
from xla_dtensor import metrics
from xla_dtensor.core.ir import topo_order
from xla_dtensor.core.tensor import value_of

from tests.xla_dtensor.ops._attention_models import DEV, cpu_losses, device_losses, gpt_loss, hf_gpt2, hf_loss, tp_2x4
B, H, L, E = 2, 4, 8, 16
NEG_INF = float("-inf")


def _causal(dev: torch.device) -> torch.Tensor:
    return torch.tril(torch.ones(L, L, device=dev))


def _masked_fill(q, k, v, extra):  # noqa: ANN001, ANN202  (the GPT tutorial's form)
    s = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(E))
    s = s.masked_fill(_causal(q.device) == 0, NEG_INF)
    return F.softmax(s, dim=-1) @ v


def _where_finfo_min(q, k, v, extra):  # noqa: ANN001, ANN202  (HF GPT-2's older eager form)
    s = torch.matmul(q, k.transpose(-1, -2))
    s = s / torch.full([], v.size(-1) ** 0.5, dtype=s.dtype, device=s.device)
    keep = torch.ones(1, 1, L, L, dtype=torch.bool, device=q.device).tril()
    s = torch.where(keep, s.to(s.dtype), torch.full([], torch.finfo(s.dtype).min, dtype=s.dtype, device=s.device))
    p = F.softmax(s, dim=-1, dtype=torch.float32).type(v.dtype)
    return torch.matmul(F.dropout(p, p=0.0, training=True), v)


def _additive(q, k, v, extra):  # noqa: ANN001, ANN202  (HF GPT-2's eager form today: a float mask from masking_utils)
    s = torch.matmul(q, k.transpose(-1, -2)) * E ** -0.5 + extra["bias"]
    return torch.matmul(F.softmax(s, dim=-1).type(v.dtype), v)


def _div_scale(q, k, v, extra):  # noqa: ANN001, ANN202
    return torch.softmax((q @ k.transpose(-2, -1)) / math.sqrt(E), dim=-1) @ v


def _upcast_softmax(q, k, v, extra):  # noqa: ANN001, ANN202  (bf16 scores, float32 softmax, cast back)
    s = (q @ k.transpose(-2, -1) * 0.25).masked_fill(_causal(q.device) == 0, NEG_INF)
    return F.softmax(s.float(), dim=-1).to(q.dtype) @ v


def _weights_kept(q, k, v, extra):  # noqa: ANN001, ANN202  (the weights are returned and differentiated too)
    w = F.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1)
    return torch.matmul(w, v), (w * w).sum()


def _one_key_value_head(q, k, v, extra):  # noqa: ANN001, ANN202  (multi-query: matmul broadcasts the kv head)
    k, v = k[:, :1], v[:, :1]
    return F.softmax(q @ k.transpose(-2, -1) * 0.25 + extra["bias"], dim=-1) @ v


def _dropout_in_training(q, k, v, extra):  # noqa: ANN001, ANN202  (p=1: every weight dropped, so CPU agrees)
    return F.dropout(F.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1), p=1.0, training=True) @ v


def _softmax_over_queries(q, k, v, extra):  # noqa: ANN001, ANN202
    return F.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-2) @ v


def _scale_after_softmax(q, k, v, extra):  # noqa: ANN001, ANN202
    return (F.softmax(q @ k.transpose(-2, -1), dim=-1) * 0.5) @ v


def _scale_after_mask(q, k, v, extra):  # noqa: ANN001, ANN202  (finfo.min * 0.25 is no longer a hole: not fused)
    s = (q @ k.transpose(-2, -1)).masked_fill(_causal(q.device) == 0, torch.finfo(q.dtype).min) * 0.25
    return F.softmax(s, dim=-1) @ v


FUSED = {  # name: (pattern, dtype)
    "causal-masked-fill": (_masked_fill, torch.float32),
    "where-finfo-min": (_where_finfo_min, torch.float32),
    "additive-mask": (_additive, torch.float32),
    "div-scale": (_div_scale, torch.float32),
    "one-key-value-head": (_one_key_value_head, torch.float32),
    "bf16-causal": (_masked_fill, torch.bfloat16),
    "bf16-upcast-softmax": (_upcast_softmax, torch.bfloat16),
}
UNFUSED = {
    "softmax-over-queries": _softmax_over_queries,
    "scale-after-softmax": _scale_after_softmax,
    "scale-after-mask": _scale_after_mask,
    "dropout-in-training": _dropout_in_training,
}


OPS_COMPUTED: list[set] = []  # the ops the device's last outputs and gradients are computed from
SCORE_OPS = {torch.ops.aten._softmax.default, torch.ops.aten._softmax_backward_data.default, torch.ops.aten.bmm.default}


def _counted() -> int:
    return metrics.counters()["fused_attention"]


def _cpu_and_device(pattern, dtype: torch.dtype = torch.float32, bias_grad: bool = False) -> tuple[list, list, int]:
    """Outputs and gradients (q, k, v and the bias where it needs one) on CPU and on the device."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, L, E, generator=g).to(dtype) for _ in range(3))
    grad = torch.randn(B, H, L, E, generator=g).to(dtype)
    bias = torch.where(torch.rand(B, 1, L, L, generator=g) > 0.3, 0.0, torch.finfo(dtype).min).to(dtype)
    if bias_grad:
        bias = torch.randn(B, 1, L, L, generator=g).to(dtype)

    def run(dev: torch.device) -> tuple[list, int, set]:
        leaves = [t.detach().to(dev).requires_grad_() for t in (q, k, v)]
        b = bias.detach().to(dev).requires_grad_(bias_grad)
        before = _counted()
        out = pattern(*leaves, {"bias": b})
        out, more = out if isinstance(out, tuple) else (out, 0)
        fused = _counted() - before
        ((out * grad.to(dev)).sum() + more).backward()
        got = [out.detach()] + [t.grad for t in leaves] + ([b.grad] if bias_grad else [])
        ops = {n.op for n in topo_order([value_of(t) for t in got])} if dev == DEV else set()
        return [t.cpu() for t in got], fused, ops
    ref, _, _ = run(torch.device("cpu"))
    got, fused, ops = run(DEV)
    OPS_COMPUTED[:] = [ops]
    return got, ref, fused


def _close(got: list, ref: list, dtype: torch.dtype) -> None:
    rtol = 1e-5 if dtype == torch.float32 else 2e-2
    for i, (a, b) in enumerate(zip(got, ref)):
        assert a.dtype == b.dtype, i
        err = ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()  # all-zero: p=1 dropout
        assert err < rtol, f"output {i} (out, dq, dk, dv, dbias): relative error {err:.2e}"


@pytest.mark.parametrize("case", list(FUSED))
def test_pattern_fused_matches_cpu(case):
    pattern, dtype = FUSED[case]
    got, ref, fused = _cpu_and_device(pattern, dtype)
    assert fused == 1
    assert not OPS_COMPUTED[0] & SCORE_OPS  # forward and backward: no score matrix, no softmax
    assert torch.ops.xla_dtensor.attention_backward.default in OPS_COMPUTED[0]
    _close(got, ref, dtype)


def test_attention_weights_kept_and_differentiated_too():
    got, ref, fused = _cpu_and_device(_weights_kept)
    assert fused == 1
    _close(got, ref, torch.float32)


@pytest.mark.parametrize("case", list(UNFUSED))
def test_other_patterns_are_left_alone_and_match_cpu(case):
    got, ref, fused = _cpu_and_device(UNFUSED[case])
    assert fused == 0
    _close(got, ref, torch.float32)


def test_a_bias_that_needs_a_gradient_is_left_alone():
    got, ref, fused = _cpu_and_device(_additive, bias_grad=True)
    assert fused == 0
    _close(got, ref, torch.float32)


def test_dropout_with_p_between_0_and_1_is_left_alone():
    q = torch.randn(B, H, L, E, device=DEV)
    before = _counted()
    dropped = F.dropout(F.softmax(q @ q.transpose(-2, -1) * 0.25, dim=-1), p=0.5, training=True)
    out = dropped @ q
    assert _counted() == before
    torch.testing.assert_close(out.cpu(), dropped.cpu() @ q.cpu())


def test_one_product_recorded_by_two_tensors_sends_gradients_to_the_right_one():
    """``q.detach() @ kt.detach()`` is the same IR node as ``q @ kt``: whichever is remembered,
    the gradient of the differentiable chain reaches ``q`` and ``k`` as in torch."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(B, H, L, E, generator=g) for _ in range(3))
    grads = []
    for dev in (torch.device("cpu"), DEV):
        qd, kd = (t.detach().to(dev).requires_grad_() for t in (q, k))
        s = qd @ kd.transpose(-2, -1)
        detached = F.softmax(qd.detach() @ kd.detach().transpose(-2, -1), dim=-1) @ v.to(dev)
        out = F.softmax(s, dim=-1) @ v.to(dev)
        (out.sum() + detached.sum()).backward()
        grads.append([t.cpu() for t in (out.detach(), detached, qd.grad, kd.grad)])
    _close(grads[1], grads[0], torch.float32)


def test_switch_off_and_no_grad():
    xla_dtensor.config.fused_attention = False
    try:
        got, ref, fused = _cpu_and_device(_masked_fill)
    finally:
        xla_dtensor.config.fused_attention = True
    assert fused == 0
    _close(got, ref, torch.float32)
    q = torch.randn(B, H, L, E)
    before = _counted()
    with torch.no_grad():
        out = _masked_fill(q.to(DEV), q.to(DEV), q.to(DEV), {})
    assert _counted() - before == 1
    torch.testing.assert_close(out.cpu(), _masked_fill(q, q, q, {}))


# ---- models: a hand-written GPT and HF GPT-2 (eager attention), lazy and compiled, 1 device and 2x4 TP ----

LAYERS = 2


class _HandWrittenAttention(Attention):
    """The benchmark GPT's attention, written out as in nanoGPT's non-flash path."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        heads = lambda y: y.view(b, t, self.n_head, c // self.n_head).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(torch.tril(torch.ones(t, t, device=x.device)) == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).reshape(b, t, c))


def _gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=LAYERS, n_head=4))
    for block in model.h:
        block.attn.__class__ = _HandWrittenAttention
    return model


MODELS = {  # name: (model maker, loss, Megatron TP)
    "hand-written-gpt": (_gpt, gpt_loss, lambda m: tp_2x4(m, LAYERS)),
    "hf-gpt2-eager": (lambda: hf_gpt2(LAYERS, "eager"), hf_loss, tp_2x4),
}


@pytest.fixture(scope="module")
def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
            for _ in range(3)]


@pytest.fixture(scope="module")
def cpu_reference(batches):
    """Each model's losses over 3 SGD steps in torch CPU eager (the oracle)."""
    return {name: cpu_losses(make(), loss_of, batches) for name, (make, loss_of, _) in MODELS.items()}


@pytest.mark.parametrize("mode", ["lazy", "compile"])
@pytest.mark.parametrize("layout", ["one-device", "tp-2x4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_models_count_one_fused_attention_per_layer_and_match_cpu(name, layout, mode, batches, cpu_reference):
    make, loss_of, tp = MODELS[name]
    got, counts = device_losses(make(), loss_of, batches, mode, tp if layout == "tp-2x4" else None)
    assert counts[0] == LAYERS  # the first call records (traces) the forward once
    if mode == "lazy":
        assert counts == [LAYERS] * len(batches)
    assert got == pytest.approx(cpu_reference[name], rel=1e-4)
