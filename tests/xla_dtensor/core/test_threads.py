"""Two Python threads, each training its own model on the device, in every mode pair.

Each thread trains a small MLP (its own seed, its own data) with Adam, in lazy mode,
through ``xla_dtensor.compile`` or in eager mode. A :class:`threading.Barrier` separates
each step's phases (forward and backward, optimizer step, sync and host read; a
``compile``d call is one atomic phase: it holds the core's lock). ``aligned``: both
threads run the same phase at once (they record, then sync, together); ``staggered``:
thread B runs one phase behind A (one syncs while the other records, and one leaves eager
mode before the other's last check). The oracle is torch CPU eager: the same model, data
and optimizer on CPU, one thread; and the same job run alone on the device. Before the
lock and per-thread ownership every mode pair failed in at least one schedule:
``RuntimeError: Array has been deleted`` in one thread, the other thread's eager mode
switched on or off, or losses off CPU's (``benchmarks/thread_probe.py`` counts them).
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import xla_dtensor
import xla_dtensor.spmd as xs

from .test_index_checks import checking  # noqa: F401  (the fixture: check_indices on, pending checks cleared)

STEPS = 3
SEEDS = (0, 1)  # thread A's model and data, thread B's
MODES = ("lazy", "compile", "eager")


def _model(seed: int) -> nn.Module:
    """NOTE: seeds torch's global generator: call it on the main thread (two threads seeding and
    drawing at once draw each other's numbers)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8))


def _data(seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(100 + seed)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 8, generator=g)) for _ in range(STEPS)]


def _adam(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=1e-2)


def forward_backward(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    loss = F.mse_loss(model(x), y)
    loss.backward()
    return loss


def update(opt: torch.optim.Optimizer) -> None:
    opt.step()
    opt.zero_grad()


def step(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """One training step: what a ``compile`` thread runs (the others run its two halves)."""
    loss = forward_backward(model, x, y)
    update(opt)
    return loss


COMPILED = xla_dtensor.compile(step)  # one compiled function shared by every thread and test


def cpu_losses(seed: int) -> list[float]:
    """The oracle: torch CPU eager, one thread."""
    model = _model(seed)
    opt = _adam(model.parameters())
    return [step(model, opt, x, y).item() for x, y in _data(seed)]


Place = Callable[[nn.Module, list], tuple[nn.Module, list]]


def _on_device(model: nn.Module, data: list) -> tuple[nn.Module, list]:
    dev = xla_dtensor.device()
    return model.to(dev), [(x.to(dev), y.to(dev)) for x, y in data]


def _check_mode(mode: str) -> None:
    """The calling thread is in eager mode exactly when it turned it on (the mode is per thread)."""
    eager = xla_dtensor.eager.is_eager()
    assert eager == (mode == "eager"), f"a {mode} thread sees is_eager() == {eager}"


def train(mode: str, seed: int, wait: Callable[[], Any] = lambda: None, behind: bool = False,
          place: Place = _on_device, model: nn.Module | None = None) -> list[float]:
    """``seed``'s model (``model``: made by ``_model(seed)`` beforehand) trained for ``STEPS``
    steps in ``mode``; the losses.

    ``wait`` (a barrier's) separates the phases: set up; then per step forward and
    backward (a ``compile``d call: the whole step), the optimizer step, and the sync and
    host read of the loss; then the check that the thread is still in its mode. The
    thread ``behind`` runs each phase while the other runs the next one: one syncs while
    the other has pending work and records its optimizer step, and one leaves eager mode
    before the other's last check.
    """
    if behind:
        wait()
    model, data = place(_model(seed) if model is None else model, _data(seed))
    opt = _adam(model.parameters())
    if mode == "eager":
        xla_dtensor.eager_mode(True)
    losses = []
    try:
        for x, y in data:
            wait()
            _check_mode(mode)
            loss = COMPILED(model, opt, x, y) if mode == "compile" else forward_backward(model, x, y)
            wait()
            if mode != "compile":
                update(opt)
            wait()
            if mode == "lazy":
                xla_dtensor.sync()
            losses.append(loss.item())
        wait()
        _check_mode(mode)
    finally:
        if mode == "eager":
            xla_dtensor.eager_mode(False)
    if not behind:
        wait()
    return losses


def run_threads(jobs: list[Callable[[threading.Barrier], Any]], timeout: float = 60.0) -> list[Any]:
    """Run each job in its own thread (all sharing one barrier); their results, or raise the
    first thread's exception (a thread that fails breaks the barrier, so none waits forever)."""
    barrier = threading.Barrier(len(jobs), timeout=timeout)
    results: list[Any] = [None] * len(jobs)
    errors: list[BaseException | None] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            results[i] = jobs[i](barrier)
        except BaseException as e:  # noqa: BLE001  (re-raised in the calling thread)
            errors[i] = e
            barrier.abort()

    threads = [threading.Thread(target=run, args=(i,), name=f"train-{i}") for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), f"{t.name} did not finish in {timeout} s"
    first = [e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)]
    first += [e for e in errors if e is not None]
    if first:
        raise first[0]
    return results


@pytest.fixture(scope="module")
def ref() -> dict[int, list[float]]:
    return {s: cpu_losses(s) for s in SEEDS}


@pytest.fixture(autouse=True)
def _switch_often() -> Any:
    """Switch threads every 10 us instead of 5 ms: ops of the two threads interleave finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    yield
    sys.setswitchinterval(old)


PAIRS = [("lazy", "lazy"), ("compile", "compile"), ("eager", "eager"),
         ("lazy", "compile"), ("lazy", "eager"), ("compile", "eager")]


@pytest.fixture(scope="module")
def sequential(ref) -> dict[tuple[str, int], list[float]]:
    """Each mode and seed run alone on this thread (the CPU oracle checks them too)."""
    out = {(mode, seed): train(mode, seed) for mode in MODES for seed in SEEDS}
    for (mode, seed), losses in out.items():
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref[seed]), rtol=1e-4, atol=0)
    return out


def _pair(modes: tuple[str, str], staggered: bool,
          places: tuple[Place, Place] = (_on_device, _on_device)) -> list[Callable[[threading.Barrier], Any]]:
    """Thread A's and thread B's jobs: B one phase behind A (``staggered``) or in step with it."""
    a, b = _model(SEEDS[0]), _model(SEEDS[1])
    return [lambda bar: train(modes[0], SEEDS[0], bar.wait, False, places[0], a),
            lambda bar: train(modes[1], SEEDS[1], bar.wait, staggered, places[1], b)]


@pytest.mark.parametrize("staggered", [False, True], ids=["aligned", "staggered"])
@pytest.mark.parametrize("modes", PAIRS, ids=["+".join(p) for p in PAIRS])
def test_two_threads_train_like_cpu_and_alone(ref, sequential, modes, staggered):
    got = run_threads(_pair(modes, staggered))
    for mode, seed, losses in zip(modes, SEEDS, got):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref[seed]), rtol=1e-4, atol=0)
        # as alone, up to float rounding: a compile trace syncs every thread, so it may cut a lazy
        # thread's step into two programs (fused differently: ~1 ulp apart in 1 of 880 probe results)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(sequential[mode, seed]), rtol=1e-6, atol=0)
    assert not xla_dtensor.eager.is_eager()  # a thread's eager mode is its own


def _dp(model: nn.Module, data: list) -> tuple[nn.Module, list]:
    """Data parallel over a 1x8 mesh: the batch split over 8 devices, the model replicated."""
    mesh = xs.Mesh(range(8), (1, 8), ("model", "data"))
    model, data = _on_device(model, data)
    for x, y in data:
        xs.mark_sharding(x, mesh, ("data", None))
        xs.mark_sharding(y, mesh, ("data", None))
    return model, data


def _tp(model: nn.Module, data: list) -> tuple[nn.Module, list]:
    """Megatron on a 2x4 mesh: the first layer split by rows, the second by columns over
    ``model``, the batch over ``data``."""
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    model, data = _on_device(model, data)
    xs.mark_sharding(model[0].weight, mesh, ("model", None))
    xs.mark_sharding(model[0].bias, mesh, ("model",))
    xs.mark_sharding(model[2].weight, mesh, (None, "model"))
    for x, y in data:
        xs.mark_sharding(x, mesh, ("data", None))
        xs.mark_sharding(y, mesh, ("data", None))
    return model, data


def test_two_threads_sharded_dp_and_tp(ref):
    """Thread A trains data parallel (1x8) lazily, thread B Megatron (2x4) through ``compile``."""
    modes = ("lazy", "compile")
    got = run_threads(_pair(modes, True, (_dp, _tp)))
    for seed, losses in zip(SEEDS, got):
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref[seed]), rtol=1e-4, atol=0)


W = torch.arange(30.0).reshape(10, 3)
ORDERS = ("bad-syncs-first", "good-syncs-first", "good-compiles")


@pytest.mark.parametrize("order", ORDERS)
def test_index_error_is_raised_in_the_thread_that_made_it(checking, order):
    """Thread A embeds index 12 of 10 rows, thread B in-range indices; their barriers interleave
    (B's may be a ``compile``d call's first trace, which syncs every thread's pending values).

    torch CPU raises ``IndexError`` for A's call; A gets it at its host read, B none and
    B's values are CPU's.
    """
    with pytest.raises(IndexError):
        F.embedding(torch.tensor([3, 12]), W)
    dev = xla_dtensor.device()
    model, (x, y) = _model(2), _data(2)[0]

    def job(idx: list[int], first: bool) -> Callable[[threading.Barrier], Any]:
        def run(bar: threading.Barrier) -> Any:
            w = W.to(dev)  # (kept: a dead input's buffer would be donated to a program with no output like it)
            out = F.embedding(torch.tensor(idx).to(dev), w) * 2
            bar.wait()  # both checks are recorded, neither computed
            if first and order == "good-compiles":
                COMPILED(model.to(dev), _adam(model.parameters()), x.to(dev), y.to(dev)).item()
            elif first:
                xla_dtensor.sync()  # launched: its checks are read at this thread's next barrier
            bar.wait()
            if not first:
                xla_dtensor.sync()
            bar.wait()  # both programs launched
            try:
                return out.cpu()
            except IndexError as e:
                return e
        return run

    bad_first = order == "bad-syncs-first"
    a, b = run_threads([job([3, 12], bad_first), job([0, 9], not bad_first)])
    assert isinstance(a, IndexError), a
    assert "index 12" in str(a) and "size 10" in str(a), str(a)
    torch.testing.assert_close(b, F.embedding(torch.tensor([0, 9]), W) * 2)


def test_a_sharded_tensors_op_waits_for_the_core_lock():
    """An op on an ``XLAShardedTensor`` (a DTensor) enters the core like any lazy tensor's: it waits
    while another thread holds the core's lock, and records as that thread's op."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard

    from xla_dtensor.core import threads
    d = xla_dtensor.distribute_tensor(torch.arange(8.0), DeviceMesh("xla", list(range(8))), [Shard(0)])
    d * 3  # first-call imports and caches here: the thread below runs only the op
    done = threading.Event()
    out: list[Any] = []

    def other() -> None:
        out.append(d * 2)
        done.set()
    with threads.LOCK:
        t = threading.Thread(target=other)
        t.start()
        assert not done.wait(0.5)  # blocked on the lock this thread holds
    t.join(30)
    assert done.is_set()
    torch.testing.assert_close(out[0].full_tensor().cpu(), torch.arange(8.0) * 2)
