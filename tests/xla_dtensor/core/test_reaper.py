"""The helper thread that frees a sync's old graph (xla_dtensor/core/reaper.py).

Oracles: weak-reference callbacks, which run on the thread that frees their object (which
thread freed a step's old arrays, and when); torch CPU eager for the losses of the steps
(``tests/_train.py``), 8 devices under DP, 2x4 Megatron, FSDP and AUTO, and one device.
"""
from __future__ import annotations

import os
import queue
import threading
import time
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F

import xla_dtensor
from tests._train import MLP_BATCHES, mlp, sharded_mlp, train
from xla_dtensor.core import reaper
from xla_dtensor.core.tensor import value_of

DEV = xla_dtensor.device()
SHARDED = ["dp", "megatron", "fsdp", "auto"]


def _model(mode: str):
    model = mlp()
    return (model.to(DEV), lambda t: t.to(DEV)) if mode == "one" else sharded_mlp(mode, model, DEV)


def _watched_step(mode: str, wait: bool) -> tuple[list[int], int, int]:
    """Train :func:`mlp` laid out for ``mode`` two steps like torch CPU, then watch a third: (the threads
    that freed the arrays the parameters held before it, how many were watched, how many were freed when
    ``sync(wait=wait)`` returned)."""
    model, put = _model(mode)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss_of = lambda x, y: F.mse_loss(model(x), y)  # noqa: E731
    ref = mlp()
    want = train(lambda x, y: F.mse_loss(ref(x), y), MLP_BATCHES[:2], torch.optim.AdamW(ref.parameters(), lr=1e-2))
    got = train(loss_of, MLP_BATCHES[:2], opt, put=put, sync=lambda: xla_dtensor.sync(wait=True))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    freed: list[int] = []
    # one device: the parameters are members of one pack; on a mesh, arrays of their own
    olds = {id(r): r for r in (value_of(p).raw for p in model.parameters())}
    refs = [weakref.ref(r, lambda _: freed.append(threading.get_ident())) for r in olds.values()]
    del olds
    x, y = MLP_BATCHES[2]
    loss_of(put(x), put(y)).backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    xla_dtensor.sync(wait=wait)
    at_return = len(freed)
    xla_dtensor.wait()
    assert all(r() is None for r in refs)
    return freed, len(refs), at_return


@pytest.mark.parametrize("mode", SHARDED)
def test_a_sharded_steps_old_arrays_are_freed_on_the_helper_and_wait_waits_for_it(mode):
    freed, watched, _ = _watched_step(mode, wait=False)
    assert watched >= 1 and len(freed) == watched
    assert set(freed) == {reaper._REAPER.thread.ident} != {threading.get_ident()}
    assert reaper.queued() == 0


def test_sync_wait_returns_once_the_old_arrays_are_freed():
    freed, watched, at_return = _watched_step("megatron", wait=True)
    assert at_return == watched == len(freed) == 4


def test_on_one_device_the_caller_frees_them_before_sync_returns():
    """(a few packs: a short free, and the helper's wake-ups cost the next step more)"""
    freed, watched, at_return = _watched_step("one", wait=False)
    assert at_return == watched == len(freed) == 1  # the parameters' pack
    assert set(freed) == {threading.get_ident()}


@pytest.mark.parametrize("option", ["free_on_helper", "donate"])
def test_with_the_helper_or_donation_off_the_caller_frees_them_before_sync_returns(option, monkeypatch):
    """(without donation the old arrays still hold their buffers: no memory waits for the helper)"""
    monkeypatch.setattr(xla_dtensor.config, option, False)
    freed, watched, at_return = _watched_step("megatron", wait=False)
    assert at_return == watched == len(freed) == 4
    assert set(freed) == {threading.get_ident()}


class _Blocker:
    """Freed only when ``gate`` opens (a helper busy with a large graph)."""

    def __init__(self, gate: threading.Event) -> None:
        self.gate = gate

    def __del__(self) -> None:
        self.gate.wait(10)


class _Mark:
    def __init__(self, seen: list[int]) -> None:
        self.seen = seen

    def __del__(self) -> None:
        self.seen.append(threading.get_ident())


def test_a_starved_helper_holds_at_most_max_queued_graphs():
    gate, seen = threading.Event(), []
    try:
        reaper.drop([_Blocker(gate)])
        for _ in range(reaper.MAX_QUEUED - 1):
            reaper.drop([object()])
        assert reaper.queued() == reaper.MAX_QUEUED
        reaper.drop([_Mark(seen)])  # one more: the caller frees it, as its reference dies
        assert seen == [threading.get_ident()]
        assert reaper.queued() == reaper.MAX_QUEUED
        assert reaper.drain(0.05) is False  # (what exit waits, at most a minute)
    finally:
        gate.set()
    assert reaper.drain() is True
    assert reaper.queued() == 0
    reaper.drop([_Mark(seen)])
    reaper.drain()
    assert seen[1] == reaper._REAPER.thread.ident != threading.get_ident()


class _EagerQueue:
    """The helper's queue, but ``put`` then sleeps: the helper takes the GIL and runs at once, before the
    names in ``drop`` and its caller let go (what a loaded machine does now and then)."""

    def __init__(self) -> None:
        self.q: queue.SimpleQueue = queue.SimpleQueue()

    def get(self):
        return self.q.get()

    def put(self, item) -> None:
        self.q.put(item)
        time.sleep(0.05)


@pytest.fixture
def eager_helper(monkeypatch) -> reaper._Reaper:
    helper = reaper._Reaper()
    helper.queue = _EagerQueue()
    monkeypatch.setattr(reaper, "_REAPER", helper)
    return helper


def test_drop_takes_the_items_out_of_the_callers_list_so_the_helper_frees_them(eager_helper):
    seen: list[int] = []
    garbage = [_Mark(seen)]
    reaper.drop(garbage)
    assert garbage == []
    assert reaper.drain(10) is True
    assert seen == [eager_helper.thread.ident] != [threading.get_ident()]


@pytest.mark.parametrize("mode", SHARDED)
def test_a_helper_that_runs_the_moment_a_graph_is_queued_still_frees_it(mode, eager_helper):
    """(it once lost the race to the caller's own names in a loaded test run: CI saw the caller free them)"""
    freed, watched, _ = _watched_step(mode, wait=False)
    assert watched >= 1 and set(freed) == {eager_helper.thread.ident}


def test_a_forked_child_starts_its_own_helper():
    reaper.drop([object()])
    reaper.drain()
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # JAX warns that fork() and its threads do not mix: the child runs no JAX
        pid = os.fork()
    if pid == 0:  # the child: the parent's helper thread is not here
        try:
            seen: list[int] = []
            reaper.drop([_Mark(seen)])
            reaper.drain()
            ok = len(seen) == 1 and seen[0] not in (threading.get_ident(), 0)
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert got == b"1"


def test_the_option_takes_only_a_bool():
    with pytest.raises(ValueError, match="free_on_helper must be True or False, got 'yes'"):
        xla_dtensor.config.free_on_helper = "yes"
    assert xla_dtensor.config.free_on_helper is True
