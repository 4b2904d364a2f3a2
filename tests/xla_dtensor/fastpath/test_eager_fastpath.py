"""Eager mode's per-op fast path: one cached program per executing op, results as torch CPU."""
from __future__ import annotations

import gc

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core import executor
from xla_dtensor.core.ir import topo_order
from xla_dtensor.core.tensor import new_tensor, value_of
from xla_dtensor.debug import analysis
from xla_dtensor.core.state import STATE


def _ops(x: torch.Tensor, w: torch.Tensor) -> list[torch.Tensor]:
    y = (x @ w.t()).view(2, 3, 4)           # mm on a view, then a view
    z = y.sum(1) * 2.5 + x[:2, :4].exp()    # scalar parameter, slice view
    x.add_(1.0)                             # in-place on a leaf
    return [y, z, x.clone()]


@pytest.mark.parametrize("debug", [False, True])
def test_eager_fast_path_matches_cpu_and_reuses_programs(dev, debug):
    torch.manual_seed(0)
    x, w = torch.randn(6, 5), torch.randn(4, 5)
    ref = _ops(x.clone(), w)
    xd, wd = x.to(dev), w.to(dev)
    was = STATE.debugging
    analysis.set_debug(debug)
    xla_dtensor.eager_mode(True)
    try:
        got = _ops(xd.clone(), wd)
        for t in got:
            assert value_of(t).fn is None or t._chain  # computed when called (views stay views)
        before = metrics.snapshot()
        again = _ops(xd.clone(), wd)  # the same ops and shapes: cached executables only
        diff = metrics.diff(before)
    finally:
        xla_dtensor.eager_mode(False)
        analysis.set_debug(was)
    assert diff["compiles"] == 0
    assert diff["executions"] >= 6
    for a, b, r in zip(got, again, ref):
        torch.testing.assert_close(a.cpu(), r, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.cpu(), r, rtol=1e-5, atol=1e-6)


def test_plan_lays_out_nodes_in_topological_order_with_shared_inputs(dev):
    a = torch.randn(3, 3).to(dev)
    b = a.exp()
    c = b + a                       # a used twice
    d = (c * b).sum()               # b shared by two users
    roots = [value_of(d), value_of(c)]
    plan = executor.make_plan(roots)
    assert [id(n) for n in plan.order] == [id(n) for n in topo_order(roots)]
    pos = {id(n): i for i, n in enumerate(plan.order)}
    for n, w in zip(plan.order, plan.wiring):
        assert w == tuple(pos[id(x)] for x in n.inputs)
    assert plan.outs == [pos[id(r)] for r in roots]
    assert [id(n) for n in plan.leaves] == [id(n) for n in plan.order if n.fn is None]
    xla_dtensor.sync()
    torch.testing.assert_close(d.cpu(), ((a.cpu().exp() + a.cpu()) * a.cpu().exp()).sum())


def test_eager_same_op_with_shared_and_distinct_inputs(dev):
    torch.manual_seed(1)
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    xd, yd = x.to(dev), y.to(dev)
    xla_dtensor.eager_mode(True)
    try:
        got = []
        for _ in range(2):  # the second round runs from the cached programs
            got.append(((xd + xd).cpu(), (xd + yd).cpu(), (yd + xd).cpu(), torch.addcmul(xd, yd, xd).cpu()))
    finally:
        xla_dtensor.eager_mode(False)
    ref = (x + x, x + y, y + x, torch.addcmul(x, y, x))
    for round_ in got:
        for a, r in zip(round_, ref):
            torch.testing.assert_close(a, r)


def test_eager_foreach_step_twice_matches_cpu(dev):
    torch.manual_seed(2)
    ps = [torch.randn(5), torch.randn(2, 3), torch.randn(4)]
    gs = [torch.randn_like(p) for p in ps]
    pd = [p.to(dev) for p in ps]
    gd = [g.to(dev) for g in gs]
    xla_dtensor.eager_mode(True)
    try:
        for _ in range(2):
            torch._foreach_mul_(pd, 0.9)
            torch._foreach_addcmul_(pd, gd, pd, value=0.5)
    finally:
        xla_dtensor.eager_mode(False)
    for _ in range(2):
        torch._foreach_mul_(ps, 0.9)
        torch._foreach_addcmul_(ps, gs, ps, value=0.5)
    for a, r in zip(pd, ps):
        torch.testing.assert_close(a.cpu(), r)


def _donated(fn) -> int:  # noqa: ANN001
    before = metrics.snapshot()
    fn()
    return metrics.diff(before)["eager_donated"]


def test_eager_inplace_reuses_a_buffer_only_when_nothing_else_holds_it(dev):
    torch.manual_seed(3)
    x = torch.randn(6, 5)
    xd = x.to(dev)
    xla_dtensor.eager_mode(True)
    try:
        assert _donated(lambda: xd.mul_(2.0)) == 1          # only the graph reads the old value
        twin = new_tensor(xd._meta, value_of(xd))             # another tensor holding the same value
        assert _donated(lambda: xd.add_(1.0)) == 0
        view = xd.view(30)                                    # a view: its cached value reads the old leaf
        assert _donated(lambda: xd.mul_(3.0)) == 0
        held = value_of(xd).data                              # the array itself held elsewhere
        assert _donated(lambda: xd.sub_(0.5)) == 0
        assert not held.is_deleted()
        del held
        step = torch.zeros((), device=dev)
        assert _donated(lambda: step.add_(1.0)) == 0          # 0-d scalars are never donated
        xla_dtensor.config.donate = False
        try:
            assert _donated(lambda: xd.add_(2.0)) == 0
        finally:
            xla_dtensor.config.donate = True
        assert _donated(lambda: torch._foreach_mul_([xd, twin], 0.5)) == 2
        views_now = view.cpu()
    finally:
        xla_dtensor.eager_mode(False)
    ref = x * 2.0
    twin_ref = ref.clone()
    ref = ((ref + 1.0) * 3.0 - 0.5 + 2.0) * 0.5
    torch.testing.assert_close(xd.cpu(), ref)
    torch.testing.assert_close(twin.cpu(), twin_ref * 0.5)
    torch.testing.assert_close(views_now, ref.view(30))
    assert step.cpu().item() == 1.0


def test_eager_ops_leave_no_reference_cycles(dev):
    """A cached eager op's garbage is freed at once (a cycle would keep its buffers until the
    collector runs)."""
    x, w = torch.randn(4, 3).to(dev), torch.randn(5, 3).to(dev)

    def ops() -> torch.Tensor:
        y = (x @ w.t()).view(2, 10)                       # an op over a view: the nested key
        torch._foreach_add_([x, w], [x.t().t(), w])       # a foreach op over views and leaves
        return y
    xla_dtensor.eager_mode(True)
    try:
        ops()  # compiles (JAX's tracing makes cycles of its own)
        gc.collect()
        gc.disable()
        try:
            for _ in range(3):
                y = ops()
            found = gc.collect()
        finally:
            gc.enable()
    finally:
        xla_dtensor.eager_mode(False)
    assert found == 0
    assert y.shape == (2, 10)
