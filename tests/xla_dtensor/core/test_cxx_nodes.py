"""The core's C++ autograd nodes: F.linear's kernel (``_cxx.install_linear``) against the Python route it
replaces (``core.linear``), and the fused attention's ``_cxx.attention`` against ``_FusedAttention.apply``.

Oracles: the same call with them off (``enable_nodes(False)``: every call goes to the Python route and
``torch.autograd.Function``, their model), bit for bit, with the same ops recorded; torch CPU for values,
gradients and autograd's own errors. The sharded and transformers runs (DP, 2x4 Megatron, FSDP, AUTO,
GPT-2) are ``test_native``'s, which count these calls; 2x4 Megatron attention against torch CPU is
``tests/xla_dtensor/ops/test_fused_attention.py``'s.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core import cxx, linear

pytestmark = pytest.mark.skipif(cxx.MODULE is None or linear.KERNEL != "cxx",
                                reason=f"the core's C++ part is not in use: {cxx.REASON}")
COUNTED = ("ops_recorded", "hash_cons_hits", "fused_linear", "fused_linear_backward", "fused_attention")


@contextlib.contextmanager
def _kernel(on: bool):
    was = cxx.MODULE.enable_nodes(on)
    try:
        yield
    finally:
        cxx.MODULE.enable_nodes(was)


def _both(run: Callable[[], Any]) -> tuple[dict, dict]:
    """``run()`` with the kernel on and off: {"out": its result, "counts": counters, "calls": (taken, routed)}."""
    got = []
    for on in (True, False):
        with _kernel(on):
            c0, k0, a0 = metrics.counters(), cxx.MODULE.linear_calls(), cxx.MODULE.attention_calls()
            out = run()
            c1, k1, a1 = metrics.counters(), cxx.MODULE.linear_calls(), cxx.MODULE.attention_calls()
        got.append({"out": out, "counts": {k: c1[k] - c0[k] for k in COUNTED},
                    "calls": (k1[0] - k0[0], k1[1] - k0[1]), "attention": (a1[0] - a0[0], a1[1] - a0[1])})
    return got[0], got[1]


def _train_step(dev, shape, bias, dtype, needs=(True, True, True)):
    def run():
        torch.manual_seed(0)
        x, w = torch.randn(shape, dtype=dtype), torch.randn(5, shape[-1], dtype=dtype)
        b = torch.randn(5, dtype=dtype) if bias else None
        ts = [t.to(dev).requires_grad_(n) for t, n in zip((x, w, b), needs) if t is not None]
        y = F.linear(*ts)
        (y.float() ** 2).sum().backward()
        return [y.cpu()] + [t.grad.cpu() for t in ts if t.requires_grad]
    return run


@pytest.mark.parametrize("shape,bias,dtype,needs", [
    ((2, 3, 8), True, torch.float32, (True, True, True)),
    ((6, 8), False, torch.float32, (True, True, True)),
    ((2, 2, 3, 8), True, torch.bfloat16, (True, True, True)),
    ((2, 3, 8), True, torch.float32, (False, True, True)),  # a frozen input: torch's formula in torch ops
    ((2, 3, 8), True, torch.float32, (True, False, False)),  # a frozen layer
])
def test_the_kernel_records_and_differentiates_as_the_python_route(dev, shape, bias, dtype, needs):
    on, off = _both(_train_step(dev, shape, bias, dtype, needs))
    assert on["calls"] == (1, 0) and off["calls"] == (0, 1)
    assert on["counts"] == off["counts"] and on["counts"]["fused_linear"] == 1
    assert on["counts"]["fused_linear_backward"] == int(all(needs[:2 if not bias else 3]))
    for a, b in zip(on["out"], off["out"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_its_node_is_named_and_chained_like_torchs(dev):
    x, w = torch.randn(3, 4).to(dev).requires_grad_(), torch.randn(2, 4).to(dev).requires_grad_()
    y = F.linear(x, w)
    assert y.requires_grad and y.grad_fn.name() == "LinearBackward"
    assert [type(f).__name__ for f, _ in y.grad_fn.next_functions] == ["AccumulateGrad", "AccumulateGrad", "NoneType"]
    with torch.no_grad():
        assert F.linear(x, w).grad_fn is None


@pytest.mark.parametrize("case", ["modified input", "second backward"])
def test_autograds_own_errors_are_torchs(dev, case):
    """A saved input written in place, a graph freed by an earlier backward: torch CPU's errors."""
    def attempt(d):
        x, w = torch.randn(3, 4).to(d).requires_grad_(), torch.randn(2, 4).to(d).requires_grad_()
        h = x * 1
        y = F.linear(h, w).sum()
        if case == "modified input":
            with torch.no_grad():
                h.add_(1)
        else:
            y.backward(retain_graph=False)
        with pytest.raises(RuntimeError) as e:
            y.backward()
        return str(e.value).splitlines()[0]
    cpu = attempt("cpu")
    for on in (True, False):  # the kernel's node and the route's Function: torch's error (up to the tensor's type)
        with _kernel(on):
            assert attempt(dev).split(":")[0] == cpu.split(":")[0]


def test_saved_tensor_hooks_and_checkpointing_see_its_saved_tensors(dev):
    packed = []

    def run():
        packed.clear()
        torch.manual_seed(0)
        x, w = torch.randn(2, 3, 4).to(dev).requires_grad_(), torch.randn(5, 4).to(dev).requires_grad_()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.shape) or t, lambda t: t):
            y = F.linear(x, w)
        g = torch.autograd.grad(y.square().sum(), (x, w))
        ck = torch.utils.checkpoint.checkpoint(lambda a: F.linear(a, w).tanh(), x, use_reentrant=False)
        gc = torch.autograd.grad(ck.sum(), (x, w))
        return [t.cpu() for t in (*g, *gc)], list(packed)

    on, off = _both(run)
    assert on["out"][1] == off["out"][1] == [torch.Size([2, 3, 4]), torch.Size([5, 4])]
    for a, b in zip(on["out"][0], off["out"][0]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.manual_seed(0)  # torch CPU: the gradients' values
    x, w = torch.randn(2, 3, 4).requires_grad_(), torch.randn(5, 4).requires_grad_()
    for a, b in zip(on["out"][0][:2], torch.autograd.grad(F.linear(x, w).square().sum(), (x, w))):
        torch.testing.assert_close(a, b)


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("case", ["dispatch mode", "1-D input", "shapes torch rejects", "option off", "forward AD",
                                  "functorch"])
def test_calls_it_does_not_take_go_to_the_route(dev, case, monkeypatch):
    """Every call outside the kernel's conditions reaches the Python route, with its result or error, and
    what never reaches the kernel is unchanged."""
    def run():
        torch.manual_seed(0)
        x, w = torch.randn(3, 4).to(dev), torch.randn(2, 4).to(dev)
        if case == "dispatch mode":
            with _Seen() as seen:
                y = F.linear(x, w)
            return y.cpu(), [op for op in seen.ops if "linear" in op]
        if case == "1-D input":
            return F.linear(x[0], w).cpu()
        if case == "shapes torch rejects":
            with pytest.raises(RuntimeError) as e:
                F.linear(x, torch.randn(2, 5).to(dev))
            return str(e.value).splitlines()[0]
        if case == "option off":
            monkeypatch.setattr(xla_dtensor.config, "fused_linear", False)
            try:
                return F.linear(x, w).cpu()
            finally:
                monkeypatch.undo()
        if case == "forward AD":
            import torch.autograd.forward_ad as fwAD
            with fwAD.dual_level():
                try:
                    return F.linear(fwAD.make_dual(x, torch.ones(3, 4).to(dev)), w).cpu()
                except Exception as e:  # the route's answer, whatever it is, is the oracle
                    return type(e).__name__, str(e).splitlines()[0]
        try:
            return torch.func.grad(lambda a: F.linear(a, w).sum())(x).cpu()
        except Exception as e:
            return type(e).__name__, str(e).splitlines()[0]

    on, off = _both(run)
    # (a dual tensor or a functorch transform reaches no AutogradPrivateUse1 kernel: torch decomposes first)
    assert on["calls"] == off["calls"] == ((0, 0) if case in ("forward AD", "functorch") else (0, 1))
    assert on["counts"] == off["counts"]
    if case == "dispatch mode":  # the mode saw the route's one op
        assert on["out"][1] == off["out"][1] == ["xla_dtensor.linear.default"]
        on["out"], off["out"] = on["out"][0], off["out"][0]
    if isinstance(on["out"], torch.Tensor):
        torch.testing.assert_close(on["out"], off["out"], rtol=0, atol=0)
    else:
        assert on["out"] == off["out"]


# ------------------------------------------------------------------------------------ attention

def _attention(dev, case, needs=(True, True, True)):
    def run():
        torch.manual_seed(0)
        hk = 1 if case == "gqa" else 2
        q, k, v = torch.randn(2, 2, 5, 8), torch.randn(2, hk, 5, 8), torch.randn(2, hk, 5, 8)
        qkv = [t.to(dev).requires_grad_(n) for t, n in zip((q, k, v), needs)]
        kw: dict = {"is_causal": True} if case in ("causal", "gqa") else {}
        if case == "bool mask":
            kw["attn_mask"] = (torch.rand(5, 5) > 0.3).to(dev)
        if case == "additive mask":
            kw["attn_mask"] = torch.randn(2, 1, 5, 5).to(dev)
        if case == "gqa":
            kw["enable_gqa"] = True
        y = F.scaled_dot_product_attention(*qkv, **kw)
        y.square().sum().backward()
        return [y.cpu()] + [t.grad.cpu() for t in qkv if t.requires_grad]
    return run


@pytest.mark.parametrize("case,needs", [("causal", (True, True, True)), ("bool mask", (True, True, True)),
                                        ("additive mask", (True, True, True)), ("gqa", (True, True, True)),
                                        ("causal", (True, False, False))])
def test_attention_records_and_differentiates_as_the_function(dev, case, needs):
    on, off = _both(_attention(dev, case, needs))
    assert on["attention"] == (1, 0) and off["attention"] == (0, 1)
    assert on["counts"] == off["counts"] and on["counts"]["fused_attention"] == 1
    for a, b in zip(on["out"], off["out"]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_attention_node_saves_its_output_and_frees_with_the_graph(dev):
    q = torch.randn(1, 2, 4, 8).to(dev).requires_grad_()
    y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert y.grad_fn.name() == "AttentionBackward"
    assert [type(f).__name__ for f, _ in y.grad_fn.next_functions] == ["AccumulateGrad"] * 3
    loss = y.sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        loss.backward()
    with torch.no_grad():
        assert F.scaled_dot_product_attention(q, q, q).grad_fn is None


def test_attention_under_a_dispatch_mode_goes_to_the_function(dev):
    def run():
        torch.manual_seed(0)
        q = torch.randn(1, 2, 4, 8).to(dev).requires_grad_()
        with _Seen() as seen:
            y = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            y.sum().backward()
        return y.cpu(), q.grad.cpu(), [op for op in seen.ops if "attention" in op]
    on, off = _both(run)
    assert on["attention"] == off["attention"] == (0, 1)
    assert on["out"][2] == off["out"][2] == ["xla_dtensor.attention.default", "xla_dtensor.attention_backward.default"]
    for a, b in zip(on["out"][:2], off["out"][:2]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
