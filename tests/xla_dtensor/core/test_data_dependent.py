"""Value-dependent shapes (boolean masks, nonzero) and out= overloads, against torch CPU."""
from __future__ import annotations

import warnings

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.jit import DataDependentWarning


@pytest.fixture(scope="module")
def dev() -> torch.device:
    return xla_dtensor.device()


def _data() -> torch.Tensor:
    torch.manual_seed(0)
    return torch.randn(5, 4)


READS = {
    "mask_full": lambda x: x[x > 0],
    "mask_rows": lambda x: x[x[:, 0] > 0],
    "mask_cols_after_slice": lambda x: x[:, x[0] > -0.5],
    "mask_then_int": lambda x: x[x[:, 1] > 0, 2],
    "nonzero": lambda x: torch.nonzero(x > 0.5),
    "where_one_arg": lambda x: torch.stack(torch.where(x > 0)),
    "argwhere": lambda x: torch.argwhere(x < 0),
    "masked_select_broadcast": lambda x: torch.masked_select(x, x[0] > 0),
    "mask_none_true": lambda x: x[x > 100],
    "unique_counts": lambda x: torch.cat(torch.unique((x * 2).round(), return_inverse=True, return_counts=True)[0:3:2]),
    "unique_inverse": lambda x: torch.unique((x * 2).round(), return_inverse=True)[1],
    "unique_consecutive": lambda x: torch.unique_consecutive((x > 0).long().flatten()),
    "unique_dim": lambda x: torch.unique((x > 0).long(), dim=0),
}


@pytest.mark.parametrize("name", sorted(READS))
def test_value_dependent_reads_match_cpu(name: str, dev: torch.device) -> None:
    fn = READS[name]
    cpu = _data()
    torch.testing.assert_close(fn(cpu.to(dev)).cpu(), fn(cpu))


WRITES = {
    "fill_scalar": lambda x: x.__setitem__(x > 0, 0.0),
    "fill_0d_tensor": lambda x: x.__setitem__(x[:, 0] > 0, torch.tensor(7.0, device=x.device)),
    "assign_values": lambda x: x.__setitem__(x > 0, torch.arange(float((x > 0).sum()), device=x.device)),
    "accumulate": lambda x: x.index_put_((x[:, 0] > 0,), torch.ones(4, device=x.device), accumulate=True),
    "functional_index_put": lambda x: x.copy_(x.index_put((x < 0,), torch.tensor(-1.0, device=x.device))),
}


@pytest.mark.parametrize("name", sorted(WRITES))
def test_masked_writes_match_cpu(name: str, dev: torch.device) -> None:
    fn = WRITES[name]
    cpu = _data()
    lazy = cpu.to(dev)
    fn(cpu)
    fn(lazy)
    torch.testing.assert_close(lazy.cpu(), cpu)


def test_fill_through_a_mask_needs_no_host_read(dev: torch.device) -> None:
    x = _data().to(dev)
    xla_dtensor.sync()
    before = metrics.counters()["transfers_to_host"]
    x[x > 0] = 0.0
    xla_dtensor.sync()
    assert metrics.counters()["transfers_to_host"] == before
    assert float(x.max()) <= 0.0


def test_gradient_through_a_boolean_mask_matches_cpu(dev: torch.device) -> None:
    cpu = _data().requires_grad_()
    lazy = cpu.detach().to(dev).requires_grad_()
    for t in (cpu, lazy):
        (t[t > 0] ** 2).sum().backward()
    torch.testing.assert_close(lazy.grad.cpu(), cpu.grad)


def test_compiled_function_with_a_mask_runs_lazily_and_correctly(dev: torch.device) -> None:
    @xla_dtensor.compile
    def positive_sum(x: torch.Tensor) -> torch.Tensor:
        return x[x > 0].sum()

    cpu = _data()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = [positive_sum(cpu.to(dev) * s).item() for s in (1.0, -1.0)]
    assert any(issubclass(w.category, DataDependentWarning) for w in caught)
    assert got == pytest.approx([cpu[cpu > 0].sum().item(), (-cpu)[-cpu > 0].sum().item()], rel=1e-6)


def test_mask_of_wrong_shape_raises_like_cpu(dev: torch.device) -> None:
    x = _data()
    with pytest.raises(IndexError) as cpu_err:
        x[torch.ones(3, dtype=torch.bool)]
    with pytest.raises(IndexError, match="shape of the mask"):
        x.to(dev)[torch.ones(3, dtype=torch.bool, device=dev)]
    assert "mask" in str(cpu_err.value)


OUTS = {
    "add": (lambda x, o: torch.add(x, x, alpha=2, out=o), lambda x: torch.empty_like(x)),
    "sum_dim": (lambda x, o: torch.sum(x, dim=1, out=o), lambda x: torch.empty(x.shape[0], device=x.device)),
    "cat": (lambda x, o: torch.cat([x, x * 2], dim=0, out=o), lambda x: torch.empty(10, 4, device=x.device)),
    "mm": (lambda x, o: torch.mm(x, x.t(), out=o), lambda x: torch.empty(5, 5, device=x.device)),
    "int_result_into_float": (lambda x, o: torch.add((x > 0).long(), 1, out=o), lambda x: torch.empty_like(x)),
}


@pytest.mark.parametrize("name", sorted(OUTS))
def test_out_variants_match_cpu(name: str, dev: torch.device) -> None:
    fn, make = OUTS[name]
    cpu = _data()
    lazy = cpu.to(dev)
    o_cpu, o_lazy = make(cpu), make(lazy)
    r_cpu, r_lazy = fn(cpu, o_cpu), fn(lazy, o_lazy)
    assert r_lazy is o_lazy
    torch.testing.assert_close(o_lazy.cpu(), o_cpu)
    torch.testing.assert_close(r_lazy.cpu(), r_cpu)


def test_out_variant_with_two_outputs_and_aliasing(dev: torch.device) -> None:
    cpu = _data()
    lazy = cpu.to(dev)
    vals = [torch.empty(5), torch.empty(5, device=dev)]
    idx = [torch.empty(5, dtype=torch.long), torch.empty(5, dtype=torch.long, device=dev)]
    for t, v, i in zip((cpu, lazy), vals, idx):
        torch.max(t, dim=1, out=(v, i))
        torch.mul(t, 3, out=t)  # out= is also an input
    torch.testing.assert_close(vals[1].cpu(), vals[0])
    torch.testing.assert_close(idx[1].cpu(), idx[0])
    torch.testing.assert_close(lazy.cpu(), cpu)


def test_out_variant_errors_leave_out_untouched(dev: torch.device) -> None:
    x = _data().to(dev)
    small = torch.zeros(3, device=dev)
    with pytest.raises(RuntimeError, match=r"out= tensor 'out' has shape \[3\] but the result has shape \[5, 4\]"):
        torch.add(x, x, out=small)
    assert small.cpu().tolist() == [0.0, 0.0, 0.0]
    longs = torch.zeros(5, 4, dtype=torch.long, device=dev)
    with pytest.raises(RuntimeError, match="can't be cast to the desired output type torch.int64"):
        torch.add(x, x, out=longs)
    assert int(longs.abs().sum()) == 0
