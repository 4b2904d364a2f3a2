"""SDPA as one fused attention op: numerics against torch CPU, the counter, the switch,
residual reuse, and models (the GPT step, HF GPT-2) on one device and under 2x4 TP,
in lazy mode and under ``xla_dtensor.compile``."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models import GPT2, GPT2Config
from tests.xla_dtensor.spmd._hlo import collectives
from xla_dtensor import metrics
from xla_dtensor.ops import fused_attention

from tests.xla_dtensor.ops._attention_models import cpu_losses, device_losses, gpt_loss, hf_gpt2, hf_loss, tp_2x4

DEV = xla_dtensor.device()
CASES = {  # name: (q shape, k/v shape, mask maker, is_causal, enable_gqa, dtype)
    "causal": ((2, 4, 8, 16), (2, 4, 8, 16), None, True, False, torch.float32),
    "gqa": ((2, 4, 8, 16), (2, 2, 8, 16), None, True, True, torch.float32),
    "bool-mask-2d": ((2, 4, 8, 16), (2, 4, 6, 16), lambda: torch.rand(8, 6) > 0.3, False, False, torch.float32),
    "additive-mask-4d": ((2, 4, 8, 16), (2, 4, 8, 16), lambda: torch.randn(2, 1, 8, 8), False, False, torch.float32),
    "unbatched": ((4, 8, 16), (4, 8, 16), None, False, False, torch.float32),
    "bf16-causal": ((2, 4, 8, 16), (2, 4, 8, 16), None, True, False, torch.bfloat16),
    "fp16-gqa": ((2, 4, 8, 16), (2, 2, 8, 16), None, True, True, torch.float16),
}
REUSE = ((1, 2, 12, 8), (1, 2, 12, 8), None, True, False, torch.float32)  # shapes of its own: compiled afresh


def _counted(name: str = "fused_attention") -> int:
    return metrics.counters()[name]


def _cpu_and_device(case: str | tuple, sync_between: bool = False) -> tuple[list, list, int]:
    qs, ks, mask_fn, causal, gqa, dtype = CASES[case] if isinstance(case, str) else case
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(*s, generator=g).to(dtype).requires_grad_() for s in (qs, ks, ks))
    grad = torch.randn(*qs, generator=g).to(dtype)
    mask = mask_fn() if mask_fn else None
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=gqa)
    out.backward(grad)
    ref = [out.detach(), q.grad, k.grad, v.grad]
    qd, kd, vd = (t.detach().to(DEV).requires_grad_() for t in (q, k, v))
    before = _counted()
    outd = F.scaled_dot_product_attention(qd, kd, vd, attn_mask=None if mask is None else mask.to(DEV),
                                          is_causal=causal, enable_gqa=gqa)
    if sync_between:
        xla_dtensor.sync()
    outd.backward(grad.to(DEV))
    xla_dtensor.sync()
    got = [t.cpu() for t in (outd.detach(), qd.grad, kd.grad, vd.grad)]
    return got, ref, _counted() - before


def _close(got: list, ref: list, dtype: torch.dtype) -> None:
    rtol = 1e-5 if dtype == torch.float32 else 2e-2
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        assert a.dtype == b.dtype, name
        err = ((a.float() - b.float()).norm() / b.float().norm()).item()
        assert err < rtol, f"{name}: relative error {err:.2e}"


@pytest.mark.parametrize("case", list(CASES))
def test_sdpa_fused_matches_cpu(case):
    got, ref, fused = _cpu_and_device(case)
    assert fused == 1
    _close(got, ref, CASES[case][-1])


def test_backward_reuses_the_forward_in_one_program(monkeypatch):
    calls = []
    real = fused_attention._attend
    monkeypatch.setattr(fused_attention, "_attend", lambda *a: calls.append(1) or real(*a))
    got, ref, _ = _cpu_and_device(REUSE, sync_between=True)  # two programs: the backward recomputes
    _close(got, ref, torch.float32)
    calls.clear()  # the signatures are known now: only the new program's lowering calls _attend
    got, ref, _ = _cpu_and_device(REUSE)  # forward and backward in one program
    _close(got, ref, torch.float32)
    assert len(calls) == 1


def test_switch_off_and_unfusable_calls_decompose():
    xla_dtensor.config.fused_attention = False
    try:
        got, ref, fused = _cpu_and_device("causal")
    finally:
        xla_dtensor.config.fused_attention = True
    assert fused == 0
    _close(got, ref, torch.float32)
    q = torch.randn(2, 4, 8, 16, device=DEV)
    bias = torch.zeros(8, 8, device=DEV, requires_grad=True)
    before = _counted()
    F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    F.scaled_dot_product_attention(q, q, q, attn_mask=bias)
    F.scaled_dot_product_attention(q, q, q[..., :8])  # value head dim differs: not the fused op's shape
    assert _counted() == before
    with pytest.raises(ValueError, match="fused_attention must be True or False, got 1"):
        xla_dtensor.config.fused_attention = 1


def test_a_call_the_gpu_kernel_cannot_take_is_counted_and_warned(monkeypatch):
    """float32 on a GPU: cuDNN's attention takes bf16/fp16 only, so the op runs XLA's math."""
    from xla_dtensor.core import sdpa
    monkeypatch.setattr(sdpa, "platform", lambda: "gpu")
    monkeypatch.setattr(fused_attention, "_WARNED", set())
    q = torch.randn(1, 2, 8, 16, device=DEV)
    before = metrics.counters()
    with pytest.warns(UserWarning, match="cuDNN attention takes bfloat16/float16, not float32"):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    F.scaled_dot_product_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), is_causal=True)
    d = metrics.diff(before)
    assert (d["fused_attention"], d["fused_attention_fallbacks"]) == (2, 1)


# ---- models: the GPT step and HF GPT-2, lazy and compiled, one device and 2x4 TP ----------------

GPT_LAYERS = 4


def _gpt() -> torch.nn.Module:
    torch.manual_seed(0)
    return GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=GPT_LAYERS, n_head=4))


MODELS = {  # name: (model maker, loss, attention layers, Megatron TP)
    "gpt": (_gpt, gpt_loss, GPT_LAYERS, lambda m: tp_2x4(m, GPT_LAYERS)),
    "hf-gpt2": (lambda: hf_gpt2(2, "sdpa"), hf_loss, 2, tp_2x4),
}


@pytest.fixture(scope="module")
def batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
            for _ in range(3)]


@pytest.mark.parametrize("mode", ["lazy", "compile"])
@pytest.mark.parametrize("layout", ["one-device", "tp-2x4"])
@pytest.mark.parametrize("name", list(MODELS))
def test_models_count_one_fused_attention_per_layer_and_match_cpu(name, layout, mode, batches):
    make, loss_of, layers, tp = MODELS[name]
    ref = cpu_losses(make(), loss_of, batches)
    got, counts = device_losses(make(), loss_of, batches, mode, tp if layout == "tp-2x4" else None)
    assert counts[0] == layers  # the first call records (traces) the forward once
    if mode == "lazy":
        assert counts == [layers] * len(batches)
    assert got == pytest.approx(ref, rel=1e-4)


def test_tp_attention_stays_local():
    """Megatron TP splits the heads: the forward attention needs no collective but the
    row-parallel output projections' all-reduces (one per block, two with the MLP)."""
    model = tp_2x4(_gpt().to(DEV), GPT_LAYERS)
    x = torch.randint(0, 64, (4, 16)).to(DEV)
    before = _counted()
    with torch.no_grad():
        model(x, x).cpu()
    kinds = [c.kind for c in collectives(xs.last_compiled_hlo())]
    assert _counted() - before == GPT_LAYERS
    assert set(kinds) == {"all-reduce"}, kinds
