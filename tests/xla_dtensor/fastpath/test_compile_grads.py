"""xla_dtensor.compile over gradients made outside the function: read through their parameters
on every call (they are new tensors each step), checked against torch CPU."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.jit import FreedInputWarning, GraphChangedWarning

from ._models import adamw, batches, cpu_losses, tiny_gpt2


def _opt_step(opt):
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("eager", [False, True], ids=["lazy", "eager"])
def test_compiled_optimizer_step_reads_each_calls_gradients_and_clears_them(dev, eager):
    """Forward and backward outside (the eager-mode workflow: debug the model op by op, compile the
    step); ``zero_grad()`` inside frees the gradients, and the replay must clear them too."""
    model, bs = tiny_gpt2(), batches(6, seed=7)
    ref = cpu_losses(copy.deepcopy(model), bs)
    m = copy.deepcopy(model).to(dev)
    opt = adamw(m.parameters())
    step = xla_dtensor.compile(_opt_step)
    got = []
    before = metrics.snapshot()
    xla_dtensor.eager_mode(eager)
    try:
        for x, y in bs:
            loss = m(x.to(dev), y.to(dev))
            loss.backward()
            step(opt)
            assert all(p.grad is None for p in m.parameters())
            got.append(loss.item())
    finally:
        xla_dtensor.eager_mode(False)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    d = metrics.diff(before)
    assert (d["compile_traces"], d["compile_replays"]) == (2, 4), d  # state creation, steady state


def test_gradients_clipped_in_place_inside_match_cpu_and_stay_set(dev):
    """``clip_grad_norm_`` scales the (outside-made) gradients in place: the replay writes the scaled
    values back into each call's own gradient tensors, which the caller still holds."""
    model, bs = tiny_gpt2(), batches(5, seed=8)

    def clipped_step(model, opt):
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
        opt.step()
        return norm

    ref_m = copy.deepcopy(model)
    ref_opt = adamw(ref_m.parameters())
    m = copy.deepcopy(model).to(dev)
    opt = adamw(m.parameters())
    step = xla_dtensor.compile(clipped_step)
    before = metrics.snapshot()
    for x, y in bs:
        ref_opt.zero_grad()
        ref_m(x, y).backward()
        ref_norm = clipped_step(ref_m, ref_opt)
        opt.zero_grad()
        m(x.to(dev), y.to(dev)).backward()
        norm = step(m, opt)
        assert ref_norm > 0.05  # clipping is active
        torch.testing.assert_close(norm.cpu(), ref_norm, rtol=1e-4, atol=0)
        for (name, p), q in zip(m.named_parameters(), ref_m.parameters()):
            torch.testing.assert_close(p.grad.cpu(), q.grad, rtol=1e-3, atol=1e-6, msg=name)
    d = metrics.diff(before)
    assert d["compile_replays"] == 3, d


def test_a_parameter_without_gradient_is_a_new_program_not_a_graph_change(dev):
    """A parameter whose gradient is None is skipped by the optimizer: the replay notices the
    changed pattern and traces again, without a GraphChangedWarning, and matches CPU."""
    model, bs = tiny_gpt2(), batches(6, seed=9)
    ref_m = copy.deepcopy(model)
    ref_opt = adamw(ref_m.parameters())
    m = copy.deepcopy(model).to(dev)
    opt = adamw(m.parameters())
    step = xla_dtensor.compile(lambda opt: opt.step())
    before = metrics.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("error", GraphChangedWarning)
        for i, (x, y) in enumerate(bs):
            for mm, o in ((ref_m, ref_opt), (m, opt)):
                o.zero_grad()
                mm(x.to(next(mm.parameters()).device), y.to(next(mm.parameters()).device)).backward()
                if i == 3:
                    next(mm.parameters()).grad = None  # the embedding skips this step
            ref_opt.step()
            step(opt)
    for (name, p), q in zip(m.named_parameters(), ref_m.parameters()):
        if "k_proj.bias" not in name:  # its gradient is rounding noise (softmax ignores it), Adam amplifies it
            torch.testing.assert_close(p.cpu(), q.detach(), rtol=1e-4, atol=1e-6, msg=name)
    d = metrics.diff(before)
    # traces: state creation, steady state (replayed at call 3), the pattern without the embedding's
    # gradient (a new program), then the full pattern again, with the embedding's step count one behind
    # the others (no longer one shared value: another new program, replayed at call 6)
    assert (d["compile_traces"], d["compile_replays"]) == (4, 2), d


def test_a_tensor_freed_inside_is_never_replayed_as_a_constant(dev):
    box: list[torch.Tensor] = []

    @xla_dtensor.compile
    def f(x):
        return x + box.pop()  # reads a tensor no argument reaches, and frees it

    x = torch.ones(3, device=dev)
    with pytest.warns(FreedInputWarning, match=r"read 1 tensor\(s\) \(shape \[3\]\) that it freed"):
        box.append(torch.full((3,), 10.0, device=dev))
        assert f(x).tolist() == [11.0] * 3
    for v in (20.0, 30.0):
        box.append(torch.full((3,), v, device=dev))
        assert f(x).tolist() == [v + 1] * 3
