"""compile(): equal optimizer step counters become one program input and output, and stop being one
when they are changed apart. Oracles: torch CPU (losses, parameters) and the compiled program's inputs."""
from __future__ import annotations

import copy
import warnings

import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.jit.args import signature

from ._models import adamw, batches, tiny_gpt2
from ._models import train_step as _train_step


def test_step_counters_share_one_input_and_split_when_one_is_changed(dev):
    model, bs = tiny_gpt2(), batches(8, seed=3)
    ref_m = copy.deepcopy(model)
    ref_opt = adamw(ref_m.parameters())
    m = copy.deepcopy(model).to(dev)
    opt = adamw(m.parameters())
    step = xla_dtensor.compile(_train_step)
    n_params = len(list(m.parameters()))
    got, ref = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no GraphChangedWarning: splitting the counters is not a graph change
        for k, (x, y) in enumerate(bs):
            if k == 5:  # change one parameter's counter alone, on both sides
                first = next(iter(m.parameters()))
                opt.state[first]["step"].add_(10)
                ref_opt.state[next(iter(ref_m.parameters()))]["step"].add_(10)
            before = metrics.snapshot()
            got.append(step(m, opt, x.to(dev), y.to(dev)).item())
            d = metrics.diff(before)
            ref.append(_train_step(ref_m, ref_opt, x, y).item())
            if k == 3:  # steady state: all the counters are one program input and one output
                entry = step._entries[signature((m, opt, x.to(dev), y.to(dev)), {}, [])]
                scalars = [s for s in entry.sources if s[0] == "cap" and s[1]().meta[0] == ()]
                assert len(scalars) == 1
                assert len(entry.alias_in) == 1 and len(entry.alias_in[0][1]) == n_params - 1
                assert entry.n_out == 3 * n_params + 1 + 1  # params, both moments, one step, the loss
                assert d["compile_replays"] == 1
            if k == 5:
                assert d["compile_traces"] == 1  # the replay saw the split and traced again
            if k == 6:
                assert d["compile_replays"] == 1
                entry = step._entries[signature((m, opt, x.to(dev), y.to(dev)), {}, [])]
                assert len([s for s in entry.sources if s[0] == "cap" and s[1]().meta[0] == ()]) == 2
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
    for (name, p), q in zip(m.named_parameters(), ref_m.parameters()):
        if "k_proj.bias" not in name:  # its gradient is rounding noise (softmax ignores it), Adam amplifies it
            torch.testing.assert_close(p.cpu(), q, rtol=1e-4, atol=1e-5, msg=name)
    assert [float(opt.state[p]["step"].cpu()) for p in m.parameters()] == \
        [float(ref_opt.state[p]["step"]) for p in ref_m.parameters()]


class _Drift(torch.optim.Optimizer):
    """0-d state that starts equal (0.0) and is updated differently per parameter."""

    def __init__(self, params):
        super().__init__(params, {"lr": 0.1})

    @torch.no_grad()
    def step(self):
        for g in self.param_groups:
            for p in g["params"]:
                st = self.state[p]
                if "acc" not in st:  # created equal (0.0) on the first step, first written on the second
                    st["acc"] = torch.zeros((), device=p.device)
                else:
                    st["acc"].add_(p.grad.abs().sum())
                p.sub_(g["lr"] * p.grad / (1 + st["acc"]))


def test_equal_scalars_written_apart_are_not_shared(dev):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    ref_m = copy.deepcopy(model)
    m = copy.deepcopy(model).to(dev)
    opt, ref_opt = _Drift(m.parameters()), _Drift(ref_m.parameters())

    def fn(model, opt, x):
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    step = xla_dtensor.compile(fn)
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(5, 4, generator=g) for _ in range(6)]
    before = metrics.snapshot()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = [step(m, opt, x.to(dev)).item() for x in xs]
    d = metrics.diff(before)
    ref = [fn(ref_m, ref_opt, x).item() for x in xs]
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-5, atol=1e-7)
    for p, q in zip(m.parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.cpu(), q, rtol=1e-5, atol=1e-6)
    # call 1 creates the state; the accumulators are then all 0.0 but written apart, so call 2's shared
    # trace is run and dropped; call 3 traces them unshared; calls 4-6 replay
    assert d["compile_replays"] == 3, d
