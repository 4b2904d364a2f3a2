"""Out-of-range indices (``config.check_indices``): torch CPU's exception type at the next barrier.

The oracle is torch CPU: the same call on CPU tensors raises the exception type we must
raise, and in-range calls return the CPU values.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Shard, distribute_tensor

import xla_dtensor
from xla_dtensor.core import index_checks

X = torch.arange(10.0)
W = torch.arange(30.0).reshape(10, 3)


def _idx(*v: int) -> torch.Tensor:
    return torch.tensor(v)


# name -> f(put) where put moves a tensor to the device under test (or leaves it on CPU)
CASES: dict[str, Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]] = {
    "embedding": lambda p: F.embedding(p(_idx(3, 12)), p(W)),
    "embedding_negative": lambda p: F.embedding(p(_idx(-1)), p(W)),
    "index": lambda p: p(X)[p(_idx(2, 15))],
    "index_negative": lambda p: p(X)[p(_idx(-11))],
    "index_2d": lambda p: p(W)[p(_idx(1)), p(_idx(7))],
    "index_select": lambda p: torch.index_select(p(W), 0, p(_idx(10))),
    "gather": lambda p: torch.gather(p(X), 0, p(_idx(99))),
    "gather_negative": lambda p: torch.gather(p(X), 0, p(_idx(-1))),
    "take": lambda p: torch.take(p(W), p(_idx(30))),
    "scatter": lambda p: p(torch.zeros(10)).scatter(0, p(_idx(12)), p(torch.ones(1))),
    "scatter_add": lambda p: p(torch.zeros(10)).scatter_add(0, p(_idx(12)), p(torch.ones(1))),
    "index_put": lambda p: p(torch.zeros(10)).index_put_((p(_idx(12)),), p(torch.ones(1))),
    "index_add": lambda p: p(torch.zeros(10)).index_add(0, p(_idx(12)), p(torch.ones(1))),
    "index_copy": lambda p: p(torch.zeros(10)).index_copy(0, p(_idx(12)), p(torch.ones(1))),
    "index_fill": lambda p: p(torch.zeros(10)).index_fill(0, p(_idx(-11)), 1.0),
    "nll_loss": lambda p: F.nll_loss(p(torch.zeros(2, 5)), p(_idx(1, 7))),
    "cross_entropy": lambda p: F.cross_entropy(p(torch.zeros(2, 5)), p(_idx(9, 1))),
}
BAD_INDEX = {"embedding": 12, "embedding_negative": -1, "index": 15, "index_negative": -11, "index_2d": 7,
             "index_select": 10, "gather": 99, "gather_negative": -1, "take": 30, "scatter": 12, "scatter_add": 12,
             "index_put": 12, "index_add": 12, "index_copy": 12, "index_fill": -11, "nll_loss": 7,
             "cross_entropy": 9}
IN_RANGE: dict[str, Callable[[Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]] = {
    "embedding": lambda p: F.embedding(p(_idx(0, 9)), p(W)),
    "index_negative": lambda p: p(X)[p(_idx(-1, -10, 9))],
    "take_negative": lambda p: torch.take(p(W), p(_idx(-30, 29))),
    "index_fill_negative": lambda p: p(torch.zeros(10)).index_fill(0, p(_idx(-1)), 1.0),
    "index_put_negative": lambda p: p(torch.zeros(10)).index_put_((p(_idx(-1)),), p(torch.ones(1))),
    "nll_ignored": lambda p: F.nll_loss(p(torch.zeros(2, 5)), p(_idx(1, -100))),
    "gather": lambda p: torch.gather(p(W), 1, p(torch.tensor([[2], [0]]))),
}


@pytest.fixture(scope="module")
def dev() -> torch.device:
    return xla_dtensor.device()


@pytest.fixture
def checking() -> Any:
    old = xla_dtensor.config.check_indices
    xla_dtensor.config.check_indices = True
    yield
    xla_dtensor.config.check_indices = old
    index_checks.PENDING.clear()
    index_checks.LAUNCHED.clear()


def _cpu_error(case: Callable[..., torch.Tensor]) -> type[Exception]:
    with pytest.raises(Exception) as e:
        case(lambda t: t)
    return type(e.value)


@pytest.mark.parametrize("name", sorted(CASES))
def test_out_of_range_raises_torchs_error_at_the_next_barrier(name: str, dev: torch.device, checking: Any) -> None:
    case = CASES[name]
    want = _cpu_error(case)
    line = inspect.getsourcelines(case)[1]
    case(lambda t: t.to(dev))  # recorded: nothing raised at the op
    with pytest.raises(want) as e:
        xla_dtensor.sync(wait=True)
    msg = str(e.value)
    assert str(BAD_INDEX[name]) in msg and "aten." in msg, msg
    assert f"{__file__}:{line}" in msg, msg  # the user's source line
    assert not index_checks.PENDING and not index_checks.LAUNCHED
    xla_dtensor.sync(wait=True)  # reported once


def test_plain_sync_raises_at_the_next_barrier(dev: torch.device, checking: Any) -> None:
    x = X.to(dev)
    y = x[torch.tensor([15]).to(dev)]
    xla_dtensor.sync()  # launched; not waited for
    z = y * 2
    with pytest.raises(IndexError, match="index 15"):
        xla_dtensor.sync()  # the next step's sync reads the previous program's checks
    torch.testing.assert_close(z.cpu(), torch.tensor([18.0]))  # the step's values are kept (clamped read)
    y2 = x[torch.tensor([20]).to(dev)]
    xla_dtensor.sync()
    with pytest.raises(IndexError, match="index 20"):
        xla_dtensor.wait()
    del y2


@pytest.mark.parametrize("name", sorted(IN_RANGE))
def test_in_range_indices_pass_and_match_cpu(name: str, dev: torch.device, checking: Any) -> None:
    case = IN_RANGE[name]
    got = case(lambda t: t.to(dev))
    torch.testing.assert_close(got.cpu(), case(lambda t: t))


def test_item_is_a_barrier_too(dev: torch.device, checking: Any) -> None:
    with pytest.raises(IndexError, match="index out of range in self"):
        F.embedding(torch.tensor([0, 10]).to(dev), W.to(dev)).sum().item()


def test_default_checks_in_lazy_and_eager_mode_and_the_switch_turns_them_off(dev: torch.device) -> None:
    assert xla_dtensor.config.check_indices is True
    emb = W.to(dev)
    try:
        out = F.embedding(torch.tensor([12]).to(dev), emb)
        with pytest.raises(IndexError, match="12"):
            out.sum().item()  # lazy mode: checked by default
        xla_dtensor.config.check_indices = False
        F.embedding(torch.tensor([12]).to(dev), emb).sum().item()  # off: XLA fills / clamps
        xla_dtensor.config.check_indices = None
        F.embedding(torch.tensor([12]).to(dev), emb).sum().item()  # None: lazy mode unchecked
        xla_dtensor.eager_mode(True)
        out = F.embedding(torch.tensor([12]).to(dev), emb)
        with pytest.raises(IndexError, match="12"):
            out.sum().item()
    finally:
        xla_dtensor.eager_mode(False)
        xla_dtensor.config.check_indices = True
        index_checks.PENDING.clear()
        index_checks.LAUNCHED.clear()


def test_sharded_index_is_checked(dev: torch.device, checking: Any) -> None:
    mesh = DeviceMesh("xla", np.arange(8).reshape(2, 4).tolist(), mesh_dim_names=("dp", "tp"))
    ids = torch.arange(16).reshape(4, 4) % 10
    ids[3, 2] = 40
    d = distribute_tensor(ids, mesh, [Shard(0), Shard(1)])
    F.embedding(d, W.to(dev))
    with pytest.raises(IndexError, match="index 40"):
        xla_dtensor.sync(wait=True)


def test_compiled_function_runs(dev: torch.device, checking: Any) -> None:
    f = xla_dtensor.compile(lambda w, i: F.embedding(i, w).sum())
    w, i = W.to(dev), torch.tensor([1, 2]).to(dev)
    want = F.embedding(torch.tensor([1, 2]), W).sum().item()
    assert [f(w, i).item() for _ in range(4)] == [want] * 4


def test_bad_setting() -> None:
    with pytest.raises(ValueError, match="check_indices must be True, False or None"):
        xla_dtensor.config.check_indices = "yes"
