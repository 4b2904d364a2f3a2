"""The pass-through subclass behind eager mode's floor row computes exactly what torch CPU computes."""
from __future__ import annotations

import copy

import torch

from benchmarks._subclass_floor import PassThrough, unwrap, wrap_parameters
from tests.xla_dtensor.fastpath._models import adamw, batches, cpu_losses, tiny_gpt2, train_step


def test_wrapped_gpt2_trains_like_torch_cpu_and_stays_wrapped():
    model, bs = tiny_gpt2(), batches(3, seed=5)
    ref = cpu_losses(copy.deepcopy(model), bs, lambda p: adamw(p))
    wrapped = wrap_parameters(copy.deepcopy(model))
    opt = adamw(wrapped.parameters())
    got = []
    for x, y in bs:
        loss = train_step(wrapped, opt, PassThrough(x), PassThrough(y))
        assert type(loss) is PassThrough
        got.append(unwrap(loss).item())
    assert len(list(wrapped.parameters())) == len(list(model.parameters()))  # tied weights stay tied
    assert all(isinstance(p, PassThrough) for p in wrapped.parameters())
    assert all(isinstance(s["exp_avg"], PassThrough) for s in opt.state.values())
    # the same CPU kernels in the same order: equal to the last bit
    assert got == ref
    for p, q in zip(wrapped.parameters(), model.parameters()):
        assert not torch.equal(unwrap(p), q.detach())  # trained: the wrapper did not hide the updates


def test_list_results_and_repr():
    a, b = torch.randn(3), torch.randn(3)
    out = torch._foreach_mul([PassThrough(a), PassThrough(b)], 2.0)
    assert [type(o) for o in out] == [PassThrough, PassThrough]
    assert torch.equal(unwrap(out[1]), b * 2)
    assert repr(PassThrough(a)).startswith("PassThrough(tensor(")


def test_keyword_tensor_arguments_are_unwrapped():
    a, o = torch.randn(3), PassThrough(torch.empty(3))
    torch.mul(PassThrough(a), 2, out=o)  # out= reaches __torch_dispatch__ as a keyword argument
    assert torch.equal(unwrap(o), a * 2)
