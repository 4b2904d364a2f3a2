"""Eager mode and the torch.compile backend against torch CPU."""
from __future__ import annotations

import copy
import functools
import importlib
import tomllib
from pathlib import Path

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics

from ._models import adamw, batches, cpu_losses, tiny_gpt2


def test_eager_mode_gpt2_matches_cpu_and_runs_each_op(dev):
    model, bs = tiny_gpt2(), batches(2, seed=5)
    ref = cpu_losses(copy.deepcopy(model), bs)
    m = copy.deepcopy(model).to(dev)
    opt = adamw(m.parameters())
    xla_dtensor.eager_mode(True)
    try:
        assert xla_dtensor.is_eager()
        got = []
        for x, y in bs:
            before = metrics.snapshot()
            loss = m(x.to(dev), y.to(dev))
            assert loss._storage.value.fn is None  # already computed, no barrier needed
            loss.backward()
            opt.step()
            opt.zero_grad()
            assert metrics.diff(before)["eager_ops"] > 50
            got.append(loss.item())
    finally:
        xla_dtensor.eager_mode(False)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)


def test_compile_inside_eager_mode_compiles_the_whole_function(dev):
    xla_dtensor.eager_mode(True)
    try:
        f = xla_dtensor.compile(lambda a, b: (a @ b).relu().sum(0))
        a, b = torch.randn(3, 4), torch.randn(4, 5)
        before = metrics.snapshot()
        out = f(a.to(dev), b.to(dev))
        assert metrics.diff(before)["eager_ops"] == 0  # traced lazily, not op by op
        torch.testing.assert_close(out.cpu(), (a @ b).relu().sum(0), rtol=1e-5, atol=1e-6)
    finally:
        xla_dtensor.eager_mode(False)


def test_eager_mode_runs_backward_on_the_calling_thread_and_restores_the_setting(dev):
    """Eager mode puts the backward on the calling thread and gives back the thread's own setting:
    here a thread that opted back in to torch's autograd thread (``config.backward_on_caller``)."""
    import threading
    x = torch.randn(3, 4).to(dev).requires_grad_()
    threads: list[str] = []
    x.register_hook(lambda g: threads.append(threading.current_thread().name))
    before = torch._C._is_multithreading_enabled()
    torch.autograd.set_multithreading_enabled(True)
    try:
        xla_dtensor.eager_mode(True)
        try:
            xla_dtensor.eager_mode(True)  # twice on: still restores the setting from before the first
            assert not torch._C._is_multithreading_enabled()
            (x * 2).sum().backward()
        finally:
            xla_dtensor.eager_mode(False)
        assert torch._C._is_multithreading_enabled()
        (x * 2).sum().backward()
    finally:
        torch._C._set_multithreading_enabled(before)
    assert threads[0] == threading.current_thread().name != threads[1]
    torch.testing.assert_close(x.grad.cpu(), torch.full((3, 4), 4.0))


_VIEW_CASES = [
    lambda a, b: a.t() * a.t(),  # one view node used twice
    lambda a, b: a.t() * b.t(),  # the same node hashes over two different tensors
    lambda a, b: a.t() @ a,  # a view and its own base
    lambda a, b: a.view(16).view(4, 4).t() @ b,  # a chain of views
    lambda a, b: functools.reduce(lambda t, _: t.t(), range(600), a) + b,  # more views than the cheap key walks
]


def test_eager_ops_on_views_of_computed_tensors_match_cpu_and_reuse_their_executables(dev):
    torch.manual_seed(0)
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    xla_dtensor.eager_mode(True)
    try:
        da, db = a.to(dev), b.to(dev)
        for order in (_VIEW_CASES, _VIEW_CASES[::-1]):  # the second round runs every cached program
            before = metrics.snapshot()
            for f in order:
                torch.testing.assert_close(f(da, db).cpu(), f(a, b), rtol=1e-5, atol=1e-6)
            compiles = metrics.diff(before)["compiles"]
        assert compiles == 0
    finally:
        xla_dtensor.eager_mode(False)


def test_eager_mode_records_without_hash_consing_and_compile_traces_with_it(dev):
    from xla_dtensor.core.tensor import value_of
    a = torch.randn(3, 4).to(dev)
    x, y = a.t(), a.t()
    assert value_of(x) is value_of(y)  # lazy: one shared node
    seen: list[bool] = []

    def f(t: torch.Tensor) -> torch.Tensor:
        u, v = t.t(), t.t()
        seen.append(value_of(u) is value_of(v))
        return (u * v).sum()
    xla_dtensor.eager_mode(True)
    try:
        x, y = a.t(), a.t()
        assert value_of(x) is not value_of(y)  # eager: each op its own node, computed at once
        out = xla_dtensor.compile(f)(a)
        assert seen == [True]  # compile's trace inside eager mode shares nodes again
        assert value_of(a.t()) is not value_of(a.t())  # and eager mode goes on without
    finally:
        xla_dtensor.eager_mode(False)
    x, y = a.t(), a.t()
    assert value_of(x) is value_of(y)
    torch.testing.assert_close(out.cpu(), (a.cpu() ** 2).sum(), rtol=1e-5, atol=1e-5)


def test_eager_mode_rejects_non_bool():
    with pytest.raises(TypeError, match="expects a bool, got str"):
        xla_dtensor.eager_mode("yes")


def test_torch_compile_backend_gpt2_training_matches_cpu():
    from xla_dtensor import dynamo_backend  # noqa: F401  (registers the backend in a source checkout)
    torch._dynamo.reset()
    model, bs = tiny_gpt2(), batches(3, seed=7)
    ref = cpu_losses(copy.deepcopy(model), bs)
    m = copy.deepcopy(model)
    cm = torch.compile(m, backend="xla_dtensor")
    before = metrics.snapshot()
    got = cpu_losses(cm, bs, lambda p: adamw(m.parameters()))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    assert metrics.diff(before)["dynamo_graphs"] == 2  # forward and backward, lowered once


def test_torch_compile_op_without_lowering_names_it():
    from xla_dtensor import dynamo_backend
    from xla_dtensor.ops.registry import get_lowering
    op = torch.ops.aten.special_bessel_j0.default
    assert get_lowering(op) is None
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.special.bessel_j0(x) + 1, backend=dynamo_backend.xla_dtensor_backend)
    with pytest.raises(Exception, match="special_bessel_j0"):
        f(torch.ones(3))


def test_entry_point_is_declared_and_resolves():
    root = Path(__file__).resolve().parents[3]
    eps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["entry-points"]["torch_dynamo_backends"]
    module, _, attr = eps["xla_dtensor"].partition(":")
    fn = getattr(importlib.import_module(module), attr)
    from torch._dynamo.backends.registry import lookup_backend
    assert lookup_backend("xla_dtensor") is fn


def test_optimizers_default_to_foreach_for_jax_params_fewer_eager_ops_same_result(dev):
    """torch picks the multi-tensor AdamW for jax parameters: fewer eager executions, CPU's numbers."""
    from torch.optim.optimizer import _default_to_fused_or_foreach
    model, bs = tiny_gpt2(), batches(2, seed=9)
    ref = cpu_losses(copy.deepcopy(model), bs)
    assert _default_to_fused_or_foreach(list(copy.deepcopy(model).to(dev).parameters()), False, False)[1]
    ops, losses = {}, {}
    for foreach in (None, False):
        m = copy.deepcopy(model).to(dev)
        opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.1, foreach=foreach)
        xla_dtensor.eager_mode(True)
        try:
            got = []
            for x, y in bs:
                loss = m(x.to(dev), y.to(dev))
                loss.backward()
                before = metrics.snapshot()
                opt.step()
                ops[foreach] = metrics.diff(before)["eager_ops"]
                opt.zero_grad()
                got.append(loss.item())
        finally:
            xla_dtensor.eager_mode(False)
        losses[foreach] = got
        torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    n_params = len(list(model.parameters()))
    assert ops[None] < n_params < ops[False], ops  # one op per parameter list vs several per parameter


def test_foreach_inplace_on_a_single_tensor_list_matches_cpu(dev):
    """``_foreach_add_`` over a one-tensor list (SGD on one parameter), with a changing lr."""
    p = torch.nn.Parameter(torch.ones(4, device=dev))
    ref = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.SGD([p], lr=0.1, foreach=True)
    ropt = torch.optim.SGD([ref], lr=0.1, foreach=False)
    for lr in (0.1, 0.2, 0.05):
        for o in (opt, ropt):
            o.param_groups[0]["lr"] = lr
        (p * p).sum().backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        (ref * ref).sum().backward()
        ropt.step()
        ropt.zero_grad()
    torch.testing.assert_close(p.detach().cpu(), ref.detach())


def test_torch_compile_of_a_foreach_optimizer_step_is_lowered_and_matches_cpu():
    """dynamo hands the backend the step's ``_foreach_*`` graph; the parameters match torch CPU's step."""
    from xla_dtensor import dynamo_backend  # noqa: F401
    torch._dynamo.reset()
    torch.manual_seed(0)
    m, ref = torch.nn.Linear(8, 4), torch.nn.Linear(8, 4)
    ref.load_state_dict(m.state_dict())
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, foreach=True)
    ropt = torch.optim.AdamW(ref.parameters(), lr=1e-2, foreach=True)
    step = torch.compile(opt.step, backend="xla_dtensor")
    x = torch.randn(3, 8)
    start = [p.detach().clone() for p in m.parameters()]
    before = metrics.snapshot()
    for _ in range(3):
        m(x).pow(2).sum().backward()
        step()
        opt.zero_grad()
        ref(x).pow(2).sum().backward()
        ropt.step()
        ropt.zero_grad()
    assert metrics.diff(before)["dynamo_graphs"] >= 1
    for p, q, p0 in zip(m.parameters(), ref.parameters(), start):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
        assert (p - p0).abs().max() > 1e-3  # the compiled step moved them (3 steps of lr 1e-2)
