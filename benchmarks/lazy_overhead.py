"""Where the host time of one lazy step goes, against torch's own eager step on one CPU thread.

The model is the 12-layer, width-64 GPT (``autoshard.models.GPT2``; vocabulary 64,
sequence 32, batch 2; AdamW by default, ``--opt sgd`` for SGD). Each case runs in its own
process (``--case``), with ``torch.set_num_threads(1)``; 3 warm-up steps, then the
medians of 10 steps:

* ``torch``: torch eager on its CPU kernels (forward, backward, optimizer step).
  Then, in turn step by step in the same process, the same step through a Python
  ``__torch_dispatch__`` that only forwards to torch's CPU kernels (``_subclass_floor.PassThrough``):
  what any recorder built as a Python tensor subclass pays before recording anything.
* ``lazy``: the same model on the ``jax`` device, ``xla_dtensor.sync()`` after each step
  (cache hits after the warm-up). Host time is the CPU time of the threads that record
  (:func:`_host_clock`): the calling thread (``time.thread_time``), which runs the backward
  too (``config.backward_on_caller``, the default), per step, also divided by the ops
  recorded per step (``metrics ops_recorded``); the parts of a step (forward, backward,
  optimizer, sync) for both cases. Overlap: the back-to-back step wall time next to the
  host wall time (until ``sync()`` returns) plus the device time (the same step with a
  ``wait()`` after ``sync()``: the wait's wall time).
* ``lazy_python``: the lazy case recording with the Python reference instead of the C hot path
  (``XLA_DTENSOR_NATIVE=0``, see ``xla_dtensor/core/native.py``).
* ``lazy_phased``: the lazy case with ``config.launch_at_backward = True`` (the default on a GPU or
  TPU, off on CPU): ``backward()`` launches the forward as it starts and the gradients as it ends.
* ``lazy_engine``: the lazy case with ``config.backward_on_caller = False``: torch runs the
  backward on its autograd device thread, whose CPU time is added to the calling thread's.
* ``lazy_tp`` / ``lazy_auto``: the lazy case on 8 devices, 2x4 Megatron (``mark_sharding`` on
  the blocks' weights, batch split on ``data``) and ``partition_fn="AUTO"`` on the 2x4 mesh
  (``benchmarks/spmd_step.place``); their host time against one device's.
* ``profile``: ``cProfile`` over 5 lazy steps, each function's own time binned into the
  parts of the per-op path (dispatch entry, signature, inference, node creation and
  hashing, output tensors, autograd and modules (everything outside our dispatch), the
  sync walk, ...). The profiler inflates Python-heavy parts; the shares are what matter.

The torch, lazy, lazy_engine, lazy_python and lazy_phased cases run in turn ``--rounds`` times (3): the table
gives the median round of each and the median of the rounds' ratios (the machine's speed drifts
over minutes). The lazy cases also time single ops (:func:`_per_op`): ``torch.add`` and
``torch.mm`` of small tensors on the device, next to the same ops through a Python
``__torch_dispatch__`` that only returns a new wrapper tensor (the floor of any Python
subclass) and on torch's CPU kernels.

* in turn (``--case lockstep``): lazy on one device, torch eager, 2x4 Megatron and AUTO, each in its own
  process, one step each in turn (:func:`_lockstep`): the lazy / torch eager and sharded / one-device
  ratios without the drift between runs.
* recording alone (``--record-only``; ``--case record_only --layout L`` per process): one device,
  2x4 Megatron and AUTO each record the forward and backward ``--steps`` times, with ``sync()`` and
  ``wait()`` between steps outside the timed part and nothing alive to compute: what recording costs per
  layout with no program running beside it (on CPU the "devices" are the host's cores, and a sharded step's
  program runs on all of them). Printed, not saved.

Usage: PYTHONPATH=. python benchmarks/lazy_overhead.py [--opt adamw|sgd] [--label after]
[--steps 10] [--rounds 3] [--no-save]
[--lockstep-only | --record-only]

Writes ``benchmarks/results/lazy_overhead.md`` (the section for ``--label``, other
labels' sections kept) and ``benchmarks/results/lazy_overhead.png``. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

RESULTS = Path(__file__).resolve().parent / "results"
N_LAYER, N_EMBD, N_HEAD, SEQ, BATCH, VOCAB = 12, 64, 4, 32, 2, 64


def _setup(device: Any, opt_name: str) -> tuple[Any, Any, Any]:
    import torch

    from autoshard.models import GPT2, GPT2Config
    torch.manual_seed(0)
    cfg = GPT2Config(vocab=VOCAB, n_positions=SEQ, n_embd=N_EMBD, n_layer=N_LAYER, n_head=N_HEAD)
    model = GPT2(cfg).to(device)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01) if opt_name == "sgd" else torch.optim.AdamW(params, lr=1e-3)
    idx = torch.randint(0, VOCAB, (BATCH, SEQ))
    tgt = torch.randint(0, VOCAB, (BATCH, SEQ))
    return model, opt, (idx.to(device), tgt.to(device))


def _step(model: Any, opt: Any, batch: tuple) -> Any:
    loss = model(*batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def _host_clock(model: Any, opt: Any, batch: tuple, sync: Callable[[], None]) -> Callable[[], float]:
    """A clock of the CPU seconds of every thread that records, found by running one step: the
    calling thread's, plus torch's autograd device thread's when the backward ran there (the
    ``jax`` device with ``config.backward_on_caller = False``)."""
    seen: list[int] = []
    loss = model(*batch)
    loss.grad_fn.register_prehook(lambda grads: seen.append(threading.get_ident()))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    sync()
    if seen[0] == threading.get_ident():
        return time.thread_time
    engine = time.pthread_getcpuclockid(seen[0])  # torch keeps that thread for the process's life
    return lambda: time.thread_time() + time.clock_gettime(engine)


def _phases(model: Any, opt: Any, batch: tuple, steps: int, sync: Any = None,
            clock: Callable[[], float] = time.thread_time) -> dict:
    """Medians (ms) of each part of a step (:func:`benchmarks._in_turn.step_parts`)."""
    from benchmarks._in_turn import step_parts
    return step_parts(model, opt, batch, steps, sync, clock)


def _ops_per_part(model: Any, opt: Any, batch: tuple, sync: Callable[[], None]) -> dict[str, int]:
    """The ops each part of one step records (``metrics ops_recorded``), parts as in :func:`_phases`:
    :func:`benchmarks._in_turn.step_parts` with that counter for its clock (it scales each difference by
    1,000, seconds to ms; undone here)."""
    from benchmarks._in_turn import step_parts
    from xla_dtensor import metrics
    counted = step_parts(model, opt, batch, 1, sync, lambda: metrics.counters()["ops_recorded"])
    return {k: round(v / 1e3) for k, v in counted.items()}


def case_torch(args: argparse.Namespace) -> dict:
    import torch
    torch.set_num_threads(1)
    model, opt, batch = _setup(torch.device("cpu"), args.opt)
    cpu, wall = [], []
    for i in range(3 + args.steps):
        w0, c0 = time.perf_counter(), time.thread_time()
        _step(model, opt, batch)
        c1, w1 = time.thread_time(), time.perf_counter()
        if i >= 3:
            cpu.append(c1 - c0)
            wall.append(w1 - w0)
    return {"cpu_ms": 1e3 * statistics.median(cpu), "wall_ms": 1e3 * statistics.median(wall),
            "phases": _phases(model, opt, batch, args.steps), "floor": _floor(model, opt, batch, args.steps)}


def _floor(model: Any, opt: Any, batch: tuple, steps: int) -> dict:
    """torch eager's step next to the same step through :class:`benchmarks._subclass_floor.PassThrough`
    (a Python ``__torch_dispatch__`` that only forwards to torch's CPU kernels, its optimizer on the
    multi-tensor path as ours), in turn step by step: medians of the CPU ms, and their ratio."""
    import copy

    import torch
    from torch.optim import optimizer

    from benchmarks._subclass_floor import PassThrough, wrap_parameters
    if PassThrough not in optimizer._foreach_supported_types:
        optimizer._foreach_supported_types.append(PassThrough)
    pmodel = wrap_parameters(copy.deepcopy(model))
    popt = type(opt)(list(pmodel.parameters()), lr=opt.defaults["lr"])
    pbatch = tuple(PassThrough(t) for t in batch)
    own, floor = [], []
    for i in range(3 + steps):
        c0 = time.thread_time()
        _step(model, opt, batch)
        c1 = time.thread_time()
        _step(pmodel, popt, pbatch)
        c2 = time.thread_time()
        if i >= 3:
            own.append(1e3 * (c1 - c0))
            floor.append(1e3 * (c2 - c1))
    return {"torch_ms": statistics.median(own), "floor_ms": statistics.median(floor),
            "ratio": statistics.median(floor) / statistics.median(own)}


def _setup_on(layout: str, opt_name: str) -> tuple[Any, Any, Any]:
    """The benchmark model on the ``jax`` device: ``"one"`` device, else :func:`_setup_sharded`'s row."""
    import xla_dtensor
    return _setup(xla_dtensor.device(), opt_name) if layout == "one" else _setup_sharded(layout, opt_name)


def _setup_sharded(row: str, opt_name: str) -> tuple[Any, Any, Any]:
    """The benchmark model laid out as ``spmd_step``'s row ``row`` ("tp": 2x4 Megatron, "auto")."""
    import torch

    from benchmarks.spmd_step import place
    base, opt, (idx, tgt) = _setup(torch.device("cpu"), opt_name)
    model, xd, yd = place(row, base, idx, tgt)
    if row == "auto":  # NOTE: the batch on the mesh once, as the Megatron row's: else AUTO's input hook moves
        import xla_dtensor.spmd as xs  # the one-device batch onto the 8 devices at every step (a device_put)
        for t in (xd, yd):
            xs.mark_sharding(t, xs.Mesh(range(8), (2, 4), ("data", "model")), ("data", None))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.01) if opt_name == "sgd" else torch.optim.AdamW(params, lr=1e-3)
    return model, opt, (xd, yd)


def _per_op(dev: Any, n: int = 2000, reps: int = 7) -> dict:
    """The fastest of ``reps`` loops of ``n`` ops, calling-thread CPU us per op (no sync inside)."""
    import torch

    class Floor(torch.Tensor):  # returns a new wrapper: torch's dispatch into Python and the wrapper, no work
        __torch_function__ = torch._C._disabled_torch_function_impl

        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
            return torch.Tensor._make_wrapper_subclass(cls, (4, 8), strides=(8, 1), dtype=torch.float32, device=dev)

    lazy = torch.randn(4, 8, device=dev), torch.randn(8, 8, device=dev)
    cpu = torch.randn(4, 8), torch.randn(8, 8)
    floor = tuple(torch.Tensor._make_wrapper_subclass(Floor, t.shape, dtype=torch.float32, device=dev) for t in cpu)
    out = {}
    for name, (x, w) in (("lazy", lazy), ("python floor", floor), ("torch CPU", cpu)):
        for op, f in (("add", lambda: torch.add(x, x)), ("mm", lambda: torch.mm(x, w))):
            best = float("inf")
            for _ in range(reps):
                c0 = time.thread_time()
                for _ in range(n):
                    f()
                best = min(best, time.thread_time() - c0)
            out[f"{name} {op}"] = 1e6 * best / n
    import xla_dtensor
    xla_dtensor.sync()
    return out


def case_lazy(args: argparse.Namespace, layout: str = "one", backward_on_caller: bool = True,
              phased: bool = False) -> dict:
    import torch
    torch.set_num_threads(1)
    import xla_dtensor
    from xla_dtensor import metrics
    xla_dtensor.config.backward_on_caller = backward_on_caller  # before the thread's first op
    xla_dtensor.config.launch_at_backward = phased
    dev = xla_dtensor.device()
    model, opt, batch = _setup_on(layout, args.opt)
    clock = _host_clock(model, opt, batch, xla_dtensor.sync)
    cpu, host_wall, ops = [], [], []
    for i in range(3 + args.steps):  # back to back: each sync() returns before its program ends
        m0 = metrics.counters()["ops_recorded"]
        w0, c0 = time.perf_counter(), clock()
        _step(model, opt, batch)
        xla_dtensor.sync()
        c1, w1 = clock(), time.perf_counter()
        if i >= 3:
            cpu.append(c1 - c0)
            host_wall.append(w1 - w0)
            ops.append(metrics.counters()["ops_recorded"] - m0)
    xla_dtensor.wait()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        _step(model, opt, batch)
        xla_dtensor.sync()
    xla_dtensor.wait()
    back_to_back = (time.perf_counter() - t0) / args.steps
    waited_host, device = [], []
    for _ in range(args.steps):  # each step waited for: host part, then the device's tail
        w0 = time.perf_counter()
        _step(model, opt, batch)
        xla_dtensor.sync()
        w1 = time.perf_counter()
        xla_dtensor.wait()
        w2 = time.perf_counter()
        waited_host.append(w1 - w0)
        device.append(w2 - w1)
    phases = _phases(model, opt, batch, args.steps, xla_dtensor.sync, clock)
    part_ops = _ops_per_part(model, opt, batch, xla_dtensor.sync)
    compiles, reused = metrics.counters()["compiles"], metrics.counters()["plans_reused"]
    from xla_dtensor.core import native
    per_op = _per_op(dev) if layout == "one" else {}
    return {"native": native.ON, "per_op_us": per_op, "plans_reused": reused, "syncs": 4 * args.steps + 4,
            "phases": phases, "part_ops": part_ops,
            "cpu_ms": 1e3 * statistics.median(cpu), "host_wall_ms": 1e3 * statistics.median(host_wall),
            "ops": statistics.median(ops), "us_per_op": 1e6 * statistics.median(cpu) / statistics.median(ops),
            "step_wall_ms": 1e3 * back_to_back, "waited_host_ms": 1e3 * statistics.median(waited_host),
            "device_ms": 1e3 * statistics.median(device), "compiles": compiles}


def case_record_only(args: argparse.Namespace) -> dict:
    """``--layout``'s model: medians of the forward's and the backward's recording CPU ms (calling thread)
    and of the ops they record, ``--steps`` times after 3 synced and waited warm-up steps. Between steps,
    outside the timed part, the gradients are dropped and ``sync()`` and ``wait()`` run: with no tensor of
    the step alive there is nothing to compute, and the step's hash-cons table goes (kept, it would answer
    every op of the next, identical step with a node already made)."""
    import torch
    torch.set_num_threads(1)
    import xla_dtensor
    from xla_dtensor import metrics
    model, opt, batch = _setup_on(args.layout, args.opt)
    for _ in range(3):
        _step(model, opt, batch)
        xla_dtensor.sync()
    xla_dtensor.wait()
    fwd, bwd, ops = [], [], []
    for _ in range(args.steps):
        m0 = metrics.counters()["ops_recorded"]
        c0 = time.thread_time()
        loss = model(*batch)
        c1 = time.thread_time()
        loss.backward()
        c2 = time.thread_time()
        ops.append(metrics.counters()["ops_recorded"] - m0)
        fwd.append(1e3 * (c1 - c0))
        bwd.append(1e3 * (c2 - c1))
        opt.zero_grad(set_to_none=True)  # the graph goes with the loss and the gradients: nothing is computed
        del loss
        xla_dtensor.sync()
        xla_dtensor.wait()
    return {"forward_ms": statistics.median(fwd), "backward_ms": statistics.median(bwd), "ops": statistics.median(ops)}


def _record_only(args: argparse.Namespace) -> dict:
    """:func:`case_record_only` for one device, 2x4 Megatron and AUTO, each in its own process."""
    return {lay: _run_case("record_only", args, lay) for lay in ("one", "tp", "auto")}


def case_lockstep(args: argparse.Namespace) -> dict:
    """One layout's model (``--layout``: ``torch`` is torch eager on CPU) stepping when the parent says so (a
    line on stdin), each step's host CPU ms and ops on a line of stdout; ``wait()`` after each step, outside
    the clock (see :func:`_lockstep`)."""
    import torch
    torch.set_num_threads(1)
    if args.layout == "torch":
        model, opt, batch = _setup(torch.device("cpu"), args.opt)
        clock, sync, wait, ops = time.thread_time, lambda: None, lambda: None, lambda: 0
    else:
        import xla_dtensor
        from xla_dtensor import metrics
        if args.layout == "phased":
            xla_dtensor.config.launch_at_backward = True
        if args.layout == "unpacked":  # one device, each state tensor its own array (xla_dtensor/core/packs.py)
            xla_dtensor.config.pack_state = False
        layout = args.layout
        if layout.endswith("_packed"):  # sharded, the sticky state packed too (config.pack_mesh_state)
            xla_dtensor.config.pack_mesh_state = True
            layout = layout[:-len("_packed")]
        model, opt, batch = _setup_on("one" if layout in ("phased", "unpacked") else layout, args.opt)
        clock, sync, wait = _host_clock(model, opt, batch, xla_dtensor.sync), xla_dtensor.sync, xla_dtensor.wait
        ops = lambda: metrics.counters()["ops_recorded"]  # noqa: E731
    from benchmarks._in_turn import serve

    def step() -> dict:
        m0 = ops()
        h0 = _helper_cpu()
        c0 = clock()
        _step(model, opt, batch)
        sync()
        c1 = clock()
        wait()
        return {"cpu_ms": 1e3 * (c1 - c0), "ops": ops() - m0, "helper_ms": 1e3 * (_helper_cpu() - h0)}
    serve(step)
    return {}


def _helper_cpu() -> float:
    """The CPU seconds of the core's helper thread that frees each sync's old graph (``core.reaper``; 0 before it
    starts, and for torch eager): not the calling thread's, reported beside it."""
    reaper = sys.modules.get("xla_dtensor.core.reaper")
    thread = None if reaper is None else reaper._REAPER.thread
    if thread is None or not thread.is_alive():
        return 0.0
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def _lockstep(args: argparse.Namespace,
              layouts: tuple[str, ...] = ("one", "torch", "no_cxx", "unpacked", "tp", "auto", "tp_packed",
                                          "auto_packed")) -> dict:
    """Each layout in its own process, stepping in turn (one step each, round after round): the medians of
    their host CPU ms per step and, per other layout, the median over rounds of its step / one device's
    (for ``torch``, torch eager on CPU, that is one device's lazy step / torch eager's: ``lazy_vs_torch``).

    NOTE: processes run minutes apart saw the machine's speed drift (AUTO / one device 1.08 in one run,
    1.63 in the next). In turn step by step, each ratio compares steps a few ms apart; each process is
    the layout alone (a one-device step in AUTO's process would run AUTO's sync hook too). Each step is
    waited for outside the clock, so no process records while another's program runs.
    """
    import tempfile

    from benchmarks._in_turn import step_in_turn
    procs, logs, failed = {}, {}, {}
    for lay in layouts:
        # no_cxx: one device without the core's C++ part (xla_dtensor.core.cxx): torch's tensor maker and fallback
        cmd = [sys.executable, __file__, "--case", "lockstep", "--layout", "one" if lay == "no_cxx" else lay,
               "--opt", args.opt]
        env = {**os.environ, "XLA_DTENSOR_CXX": "0"} if lay == "no_cxx" else None
        logs[lay] = tempfile.TemporaryFile("w+")  # (a pipe could fill up with warnings while we read stdout)
        procs[lay] = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=logs[lay], text=True,
                                      env=env)
    try:
        for lay in list(procs):
            if procs[lay].stdout.readline().strip() != "ready":  # e.g. TorchVersionError for a sharded layout
                procs[lay].wait()
                logs[lay].seek(0)
                lines = logs[lay].read().strip().splitlines()
                failed[lay] = {"error": lines[-1] if lines else f"exit {procs[lay].returncode}"}
                del procs[lay]
        if "one" not in procs:
            return failed
        steps = step_in_turn(procs, 3 * args.steps)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
        for log in logs.values():
            log.close()
    out = {lay: {"cpu_ms": statistics.median(s["cpu_ms"] for s in v), "ops": statistics.median(s["ops"] for s in v),
                 "helper_ms": statistics.median(s["helper_ms"] for s in v)}
           for lay, v in steps.items()}
    for lay in steps:
        pairs = list(zip(steps[lay], steps["one"]))
        if lay == "torch":
            out[lay]["lazy_vs_torch"] = statistics.median(b["cpu_ms"] / a["cpu_ms"] for a, b in pairs)
        elif lay != "one":
            out[lay]["vs_one"] = statistics.median(a["cpu_ms"] / b["cpu_ms"] for a, b in pairs)
    return {**out, **failed}


# (category, regex over "file:function"), first match wins; order matters
_BINS = [
    ("dispatch entry", r"core/tensor\.py:__torch_dispatch__|core/threads\.py:(enter|_learn|_inherit)|"
                       r"core/dispatch\.py:dispatch$|core/special\.py|core/autocast\.py|attention_pattern\.py|"
                       r"core/backward_errors\.py"),
    ("signature", r"core/signature\.py:(_arg|signature|op_info)|core/tensor\.py:value_of|core/plan"),
    ("inference (new signature)", r"core/entries\.py|core/signature\.py:(template|fill|tmpl)|jax/|jaxlib/|"
                                  r"torch/_meta|torch/_prims|torch/_refs|torch/_decomp"),
    ("node creation + hashing", r"core/ir\.py:(make_node|__init__|getitem|data_leaf|param_leaf)|core/views\.py|"
                                r"weakref\.py|random"),
    ("record (rest of dispatch)", r"core/dispatch\.py"),
    ("output tensors", r"core/tensor\.py:(new_tensor|new_view|write|__init__)|_make_wrapper_subclass|_weakrefset"),
    ("sync walk + launch", r"core/executor\.py|core/plan_cache\.py|core/ir\.py:(topo_order|tape|clear_cons)|"
                           r"core/index_checks|core/threads\.py|"
                           r"jit/|sharding/|spmd/"),
    ("optimizer (Python)", r"torch/optim/"),
    ("autograd + modules (torch)", r"torch/|autoshard/models|<built-in method torch|<method 'backward'|"
                                   r"run_backward|<built-in method"),
]


def case_profile(args: argparse.Namespace) -> dict:
    import cProfile
    import pstats

    import torch
    torch.set_num_threads(1)
    import xla_dtensor
    from xla_dtensor import metrics
    dev = xla_dtensor.device()
    model, opt, batch = _setup(dev, args.opt)
    for _ in range(3):
        _step(model, opt, batch)
        xla_dtensor.sync()
    xla_dtensor.wait()
    n = 5
    m0 = metrics.counters()["ops_recorded"]
    prof = cProfile.Profile(time.thread_time)
    prof.enable()
    for _ in range(n):
        _step(model, opt, batch)
        xla_dtensor.sync()
    prof.disable()
    xla_dtensor.wait()
    ops = (metrics.counters()["ops_recorded"] - m0) / n
    stats = pstats.Stats(prof)
    bins: dict[str, float] = {name: 0.0 for name, _ in _BINS}
    bins["other"] = 0.0
    top: list[tuple[float, str]] = []
    def bin_of(name: str) -> str:
        return next((cat for cat, rx in _BINS if re.search(rx, name)), "other")

    for (file, _line, func), (_cc, _nc, tt, _ct, callers) in stats.stats.items():  # type: ignore[attr-defined]
        name = f"{file}:{func}"
        top.append((tt, name))
        if file == "~" and callers and "torch" not in func and "backward" not in func:
            for (cfile, _cl, cfunc), ctimes in callers.items():  # a builtin's time goes to its caller's part
                bins[bin_of(f"{cfile}:{cfunc}")] += ctimes[2]
        else:
            bins[bin_of(name)] += tt
    top.sort(reverse=True)
    total = sum(bins.values())
    return {"ops": ops, "total_ms": 1e3 * total / n,
            "bins_us_per_op": {k: 1e6 * v / n / ops for k, v in bins.items()},
            "top": [(round(1e6 * t / n / ops, 3), re.sub(r".*/site-packages/|.*/work/main/", "", s))
                    for t, s in top[:25]]}


CASES = {"torch": case_torch, "lazy": case_lazy, "profile": case_profile,
         "lazy_tp": lambda a: case_lazy(a, "tp"), "lazy_auto": lambda a: case_lazy(a, "auto"),
         "lazy_engine": lambda a: case_lazy(a, backward_on_caller=False),
         "lazy_phased": lambda a: case_lazy(a, phased=True),
         "lazy_python": case_lazy,  # run with XLA_DTENSOR_NATIVE=0 (see _run_case)
         "lockstep": case_lockstep, "record_only": case_record_only}


def _run_case(name: str, args: argparse.Namespace, layout: str | None = None) -> dict:
    cmd = [sys.executable, __file__, "--case", name, "--opt", args.opt, "--steps", str(args.steps)]
    if layout is not None:
        cmd += ["--layout", layout]
    env = {**os.environ, "XLA_DTENSOR_NATIVE": "0"} if name == "lazy_python" else None
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def _sharded_case(name: str, args: argparse.Namespace) -> dict:
    """A sharded case's row, or ``{"error": its last line}`` (e.g. ``TorchVersionError`` on torch 2.11):
    the one-device table still prints."""
    try:
        return _run_case(name, args)
    except subprocess.CalledProcessError as e:
        lines = (e.stderr or "").strip().splitlines()
        return {"error": lines[-1] if lines else f"exit {e.returncode}"}


def _alternated(args: argparse.Namespace) -> tuple[dict, dict, dict, dict, dict]:
    """The torch, lazy, lazy_engine, lazy_python and lazy_phased cases run in turn ``--rounds`` times (one process
    each); each one's round closest to its median host time, with the ratios' medians over rounds.

    NOTE: the shared machine's speed drifts over minutes (one step's time varies 1.5x between
    runs of the same code): a ratio taken from two runs minutes apart says more about the
    drift than about the code, one from adjacent runs less.
    """
    rounds = [tuple(_run_case(c, args) for c in ("torch", "lazy", "lazy_engine", "lazy_python", "lazy_phased"))
              for _ in range(args.rounds)]
    pick = lambda xs: sorted(xs, key=lambda r: r["cpu_ms"])[len(xs) // 2]  # noqa: E731
    t, lz, eng, py, ph = (pick([r[i] for r in rounds]) for i in range(5))
    lz = {**lz, "ratios": [r[1]["cpu_ms"] / r[0]["cpu_ms"] for r in rounds],
          "wall_ratios": [r[1]["host_wall_ms"] / r[0]["wall_ms"] for r in rounds]}
    eng = {**eng, "ratios": [r[2]["cpu_ms"] / r[0]["cpu_ms"] for r in rounds],
           "wall_ratios": [r[2]["host_wall_ms"] / r[0]["wall_ms"] for r in rounds],
           "vs_caller": [r[2]["cpu_ms"] / r[1]["cpu_ms"] for r in rounds]}
    py = {**py, "ratios": [r[3]["cpu_ms"] / r[0]["cpu_ms"] for r in rounds],
          "c_vs_python": [r[1]["cpu_ms"] / r[3]["cpu_ms"] for r in rounds]}
    ph = {**ph, "vs_whole": [r[4]["cpu_ms"] / r[1]["cpu_ms"] for r in rounds],
          "waited_vs_whole": [(r[4]["waited_host_ms"] + r[4]["device_ms"]) / (r[1]["waited_host_ms"] + r[1]["device_ms"])
                              for r in rounds]}
    return t, lz, eng, py, ph


def _table(label: str, opt: str, t: dict, lz: dict, eng: dict, py: dict, ph: dict, pr: dict, sharded: dict,
           lock: dict) -> str:
    lines = [f"## {label} ({opt})", "", "```"]
    lines.append(f"{'case':<38}{'value':>10}")
    rows = [
        ("torch eager step, CPU ms", t["cpu_ms"]),
        ("lazy host CPU ms / step", lz["cpu_ms"]),
        ("lazy / torch eager", statistics.median(lz["ratios"])),
        ("ops recorded / step", lz["ops"]),
        ("lazy host CPU us / recorded op", lz["us_per_op"]),
        ("lazy host wall ms (until sync)", lz["host_wall_ms"]),
        ("torch eager step wall ms", t["wall_ms"]),
        ("lazy host wall / torch eager wall", statistics.median(lz["wall_ratios"])),
        ("lazy step wall ms (back to back)", lz["step_wall_ms"]),
        ("waited: host wall ms", lz["waited_host_ms"]),
        ("waited: device tail ms", lz["device_ms"]),
        ("host + device ms", lz["waited_host_ms"] + lz["device_ms"]),
        ("compiles (whole run)", lz["compiles"]),
        ("syncs with a reused plan (whole run)", lz.get("plans_reused", 0)),
        ("syncs (whole run)", lz.get("syncs", 0)),
        ("Python floor (PassThrough): CPU ms", t["floor"]["floor_ms"]),
        ("  its / torch eager (same process)", t["floor"]["ratio"]),
        ("Python recorder: CPU ms / step", py["cpu_ms"]),
        ("  its / torch eager", statistics.median(py["ratios"])),
        ("  its CPU us / recorded op", py["us_per_op"]),
        ("  C recorder / Python recorder", statistics.median(py["c_vs_python"])),
        ("backward on autograd thread: CPU ms", eng["cpu_ms"]),
        ("  its / torch eager", statistics.median(eng["ratios"])),
        ("  its / backward on caller", statistics.median(eng["vs_caller"])),
        ("  its host wall / torch eager wall", statistics.median(eng["wall_ratios"])),
        ("launched in phases: CPU ms / step", ph["cpu_ms"]),
        ("  its / one program", statistics.median(ph["vs_whole"])),
        ("  its waited host + device ms", ph["waited_host_ms"] + ph["device_ms"]),
        ("  its waited / one program's", statistics.median(ph["waited_vs_whole"])),
    ]
    failed = []
    for name, sh in sharded.items():
        if "error" in sh:
            failed.append(f"{name}: failed: {sh['error']}")
            continue
        rows += [(f"{name}: host CPU ms / step", sh["cpu_ms"]), (f"{name} / one device", sh["cpu_ms"] / lz["cpu_ms"]),
                 (f"{name}: ops recorded / step", sh["ops"])]
    names = {"one": "lazy one device", "torch": "torch eager", "tp": "2x4 Megatron", "auto": "AUTO 2x4",
             "no_cxx": "no C++ part", "phased": "in phases", "unpacked": "state unpacked",
             "tp_packed": "2x4 Megatron, mesh packed", "auto_packed": "AUTO 2x4, mesh packed"}
    for lay, res in lock.items():
        if "error" in res:
            failed.append(f"in turn: {names[lay]}: failed: {res['error']}")
            continue
        rows.append((f"in turn: {names[lay]} CPU ms / step", res["cpu_ms"]))
        if res.get("helper_ms"):
            rows.append(("  its helper thread's CPU ms / step", res["helper_ms"]))
        if "vs_one" in res:
            rows.append((f"  {names[lay]} / one device", res["vs_one"]))
        if "lazy_vs_torch" in res:
            rows.append(("  lazy one device / torch eager", res["lazy_vs_torch"]))
    for name, v in rows:
        lines.append(f"{name:<38}{v:>10.2f}")
    lines += failed
    lines.append("in turn: one process per layout, one step each in turn, each waited for outside the clock; "
                 "its ratio: the median over rounds; the helper thread frees each sync's old graph "
                 "(xla_dtensor/core/reaper.py), its CPU time is not the calling thread's")
    lines.append(f"lazy / torch eager per round: {', '.join(f'{r:.2f}' for r in lz['ratios'])} "
                 "(torch, then lazy, in turn; the table: the median round of each, the ratios' median)")
    lines.append(f"C / Python recorder per round: {', '.join(f'{r:.2f}' for r in py['c_vs_python'])}")
    if not lz.get("native") or py.get("native"):
        lines.append(f"NOTE: the lazy case ran {'with' if lz.get('native') else 'WITHOUT'} the C recorder, "
                     f"the Python case {'WITH' if py.get('native') else 'without'} it")
    lines.append("")
    lines.append("single ops, calling-thread CPU us per op (fastest of 7 loops of 2,000; 4x8 and 8x8 float32):")
    lines.append(f"  {'':<26}{'C recorder':>12}{'Python rec.':>12}")
    for k in lz.get("per_op_us", {}):
        lines.append(f"  {k:<26}{lz['per_op_us'][k]:>12.2f}{py.get('per_op_us', {}).get(k, float('nan')):>12.2f}")
    lines.append("")
    lines.append("parts of a step, ms (CPU time of the threads that record):")
    lines.append(f"  {'':<22}" + "".join(f"{k:>15}" for k in lz["phases"]))
    for who, res in (("torch eager", t), ("lazy", lz), ("lazy, Python recorder", py), ("lazy, autograd thread", eng),
                     ("lazy, in phases", ph)):
        lines.append(f"  {who:<22}" + "".join(f"{res['phases'].get(k, 0.0):>15.2f}" for k in lz["phases"]))
    ops = lz["part_ops"]  # what each part records (the same parts as the phases), and its CPU time per op
    lines.append(f"  {'lazy: ops recorded':<22}" + "".join(f"{ops[k]:>15d}" for k in lz["phases"]))
    lines.append(f"  {'lazy: us / op':<22}" + "".join(
        f"{1e3 * lz['phases'][k] / ops[k]:>15.2f}" if ops[k] else f"{'-':>15}" for k in lz["phases"]))
    lines.append("")
    lines.append(f"profile (cProfile, thread CPU time; {pr['total_ms']:.1f} ms/step under the profiler), us per op:")
    for k, v in sorted(pr["bins_us_per_op"].items(), key=lambda kv: -kv[1]):
        lines.append(f"  {k:<32}{v:>8.2f}")
    lines.append("top functions (own time, us per op):")
    for us, name in pr["top"][:15]:
        lines.append(f"  {us:>7.3f}  {name}")
    lines += ["```", ""]
    return "\n".join(lines)


def _save(label: str, section: str, summary: dict) -> None:
    RESULTS.mkdir(exist_ok=True)
    md = RESULTS / "lazy_overhead.md"
    js = RESULTS / "lazy_overhead.json"
    data = json.loads(js.read_text()) if js.exists() else {}
    data[label] = summary
    js.write_text(json.dumps(data, indent=1, sort_keys=True))
    head = ("# lazy_overhead\n\nOutput of `PYTHONPATH=. python benchmarks/lazy_overhead.py --label LABEL` "
            "(12-layer width-64 GPT, sequence 32, batch 2; one process per case, one torch thread; medians of "
            "10 steps after 3 warm-up; host time = the CPU time of the threads that record. Before the seventh "
            "session's sections: the calling thread's only, which left out the backward that torch ran on its "
            "autograd thread). One section per label.\n\n")
    from benchmarks._in_turn import save_section
    save_section(md, head, label, section)
    _plot(data)


def _plot(data: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = list(data)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    x = range(len(labels))
    a.bar([i - 0.2 for i in x], [data[k]["torch_ms"] for k in labels], 0.4, label="torch eager step (CPU)")
    a.bar([i + 0.2 for i in x], [data[k]["lazy_cpu_ms"] for k in labels], 0.4, label="lazy host CPU")
    a.set_xticks(list(x), labels)
    a.set_ylabel("ms / step")
    a.legend()
    a.set_title("12-layer width-64 GPT step")
    cats = sorted({c for k in labels for c in data[k]["bins"]})
    bottom = [0.0] * len(labels)
    for c in cats:
        vals = [data[k]["bins"].get(c, 0.0) for k in labels]
        b.bar(list(x), vals, 0.5, bottom=bottom, label=c)
        bottom = [p + v for p, v in zip(bottom, vals)]
    b.set_xticks(list(x), labels)
    b.set_ylabel("us / recorded op (under cProfile)")
    b.legend(fontsize=7)
    b.set_title("where the per-op time goes")
    fig.tight_layout()
    fig.savefig(RESULTS / "lazy_overhead.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--case", choices=list(CASES))
    p.add_argument("--opt", choices=["adamw", "sgd"], default="adamw")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=3, help="torch and lazy cases run in turn this many times")
    p.add_argument("--label", default="current")
    p.add_argument("--layout", choices=["one", "torch", "tp", "auto", "phased", "unpacked", "tp_packed", "auto_packed"],
                   default="one",
                   help="the lockstep case's model (phased: one device, launched in phases at backward(); "
                        "unpacked: one device, config.pack_state off; *_packed: config.pack_mesh_state on)")
    p.add_argument("--lockstep-only", action="store_true", help="only the layouts in turn (printed, not saved)")
    p.add_argument("--record-only", action="store_true",
                   help="only recording per layout, with no program running (printed, not saved)")
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    if args.case:
        res = CASES[args.case](args)
        if args.case != "lockstep":
            print(json.dumps(res))
        return
    if args.lockstep_only:
        print(json.dumps(_lockstep(args), indent=1))
        return
    if args.record_only:
        print(json.dumps(_record_only(args), indent=1))
        return
    t, lz, eng, py, ph = _alternated(args)
    pr = _run_case("profile", args)
    sharded = {"lazy 2x4 Megatron": _sharded_case("lazy_tp", args), "lazy AUTO 2x4": _sharded_case("lazy_auto", args)}
    lock = _lockstep(args)
    section = _table(args.label, args.opt, t, lz, eng, py, ph, pr, sharded, lock)
    print(section)
    if not args.no_save:
        _save(f"{args.label} ({args.opt})", section, {"torch_ms": t["cpu_ms"], "lazy_cpu_ms": lz["cpu_ms"],
                                                      "us_per_op": lz["us_per_op"], "bins": pr["bins_us_per_op"],
                                                      "lazy": lz, "torch": t, "sharded": sharded, "lazy_engine": eng,
                                                      "lazy_python": py, "lazy_phased": ph, "in_turn": lock})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``benchmarks.*`` from a plain checkout
    main()
