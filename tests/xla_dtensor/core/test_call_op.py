"""The core's own ops (fused linear and attention, forward and backward) enter the recorder
directly (``core.tensor.call_op``) where torch's dispatcher would take them to it anyway.

Oracles: torch CPU for values and gradients; the same model recorded with the shortcut off
(``call_op`` then goes through torch's dispatcher) for the recorded graph; a
``TorchDispatchMode`` must still see every one of those ops; a sharded tensor keeps its class.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core import tensor as T


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.out = torch.nn.Linear(16, 48), torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.view(2, 5, 2, 8).transpose(1, 2) for t in self.qkv(x).split(16, -1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(2, 5, 16))


def _grads(dev, shortcut: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, list, dict]:
    if not shortcut:  # call_op then takes torch's dispatcher, as when a mode is active
        monkeypatch.setattr(T, "_DISPATCH_STACK", lambda: 1)
    torch.manual_seed(0)
    model, x = _Block().to(dev), torch.randn(2, 5, 16).to(dev)
    c0 = metrics.counters()
    loss = model(x).square().mean()
    loss.backward()
    c1 = metrics.counters()
    counts = {k: c1[k] - c0[k] for k in ("ops_recorded", "hash_cons_hits", "fused_linear", "fused_attention",
                                         "fused_linear_backward")}
    monkeypatch.undo()
    return loss.cpu(), [p.grad.cpu() for p in model.parameters()], counts


def test_same_graph_and_values_as_through_torch_and_as_cpu(dev, monkeypatch):
    fast, slow = _grads(dev, True, monkeypatch), _grads(dev, False, monkeypatch)
    torch.manual_seed(0)
    model, x = _Block(), torch.randn(2, 5, 16)
    loss = model(x).square().mean()
    loss.backward()
    assert fast[2] == slow[2] and fast[2]["fused_linear"] == 2 and fast[2]["fused_attention"] == 1
    torch.testing.assert_close(fast[0], loss.detach())
    torch.testing.assert_close(fast[0], slow[0], rtol=0, atol=0)
    for f, s, p in zip(fast[1], slow[1], model.parameters()):
        torch.testing.assert_close(f, p.grad)
        torch.testing.assert_close(f, s, rtol=0, atol=0)


def test_a_dispatch_mode_still_sees_the_ops(dev):
    seen: list[str] = []

    class Log(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
            seen.append(str(func))
            return func(*args, **(kwargs or {}))
    torch.manual_seed(0)
    model, x = _Block().to(dev), torch.randn(2, 5, 16).to(dev)
    with Log():
        model(x).sum().backward()
    # the qkv projection's input needs no gradient: its backward is torch ops, the output projection's one op
    for op, n in (("linear", 2), ("linear_backward", 1), ("attention", 1), ("attention_backward", 1)):
        assert seen.count(f"xla_dtensor.{op}.default") == n, (op, seen)


def test_a_sharded_input_keeps_its_class(dev):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Replicate, Shard
    mesh = DeviceMesh("xla", list(range(4)))
    x = xla_dtensor.distribute_tensor(torch.randn(4, 3, 8), mesh, [Shard(0)])
    w = xla_dtensor.distribute_tensor(torch.randn(5, 8), mesh, [Replicate()])
    y = F.linear(x, w)
    assert type(y) is type(x)
    torch.testing.assert_close(y.full_tensor().cpu(), F.linear(x.full_tensor().cpu(), w.full_tensor().cpu()))


def test_functorch_grad_and_vmap_match_cpu(dev):
    torch.manual_seed(0)
    x, w = torch.randn(2, 3, 8), torch.randn(5, 8)
    f = lambda w, x: F.linear(x, w).square().sum()  # noqa: E731
    torch.testing.assert_close(torch.func.grad(f)(w.to(dev), x.to(dev)).cpu(), torch.func.grad(f)(w, x))
    torch.testing.assert_close(torch.func.vmap(lambda x: F.linear(x, w.to(dev)))(x.to(dev)).cpu(),
                               torch.func.vmap(lambda x: F.linear(x, w))(x))


def test_a_sharded_and_a_plain_argument_make_a_sharded_result_with_cpus_gradient(dev):
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    torch.manual_seed(0)
    x, w = torch.randn(4, 3, 8), torch.randn(5, 8, requires_grad=True)
    xd = xla_dtensor.distribute_tensor(x, DeviceMesh("xla", list(range(4))), [Shard(0)])
    wd = w.detach().to(dev).requires_grad_()  # plain: call_op enters the sharded class's entry
    y = F.linear(xd, wd)
    assert type(y) is type(xd)
    y.square().sum().backward()
    F.linear(x, w).square().sum().backward()
    torch.testing.assert_close(y.full_tensor().cpu(), F.linear(x, w).detach())
    torch.testing.assert_close(wd.grad.cpu(), w.grad)


def test_direct_subclass_takes_only_a_lazy_tensor_subclass():
    from xla_dtensor.core import tensor as T
    with pytest.raises(TypeError, match="LazyTensor subclass, got <class 'torch.Tensor'>"):
        T.direct_subclass(torch.Tensor)
