"""Host overhead of the lazy core vs plain ``jax.jit`` of the same computation.

Per-op: chains of N ``add`` / ``mm`` / ``view`` ops recorded on a cache hit (the
graph compiled in warm-up), microseconds of host time per recorded op, next to one
call of the same program as a ``jax.jit``-compiled function (its host time / N).
Per-step: host milliseconds of a GPT-2 training step (forward, backward, AdamW,
``sync()`` on a cache hit) vs calling the step's own compiled executable directly.
Modes: the same GPT-2 train step (forward, backward, AdamW) in lazy mode (retraced
every step; also with a wait after each step, which shows how much execution the
asynchronous dispatch hides under the next step's tracing), ``xla_dtensor.compile``
(replayed; also with the blocks run 3 times over, 3x the ops with the same state, and
on a 6-layer model), eager mode (also with ``AdamW(fused=True)``, and with the
optimizer step under ``compile``), ``torch.compile(backend="xla_dtensor")`` (a CPU
model: dynamo cannot yet fakify jax-device tensors, so each step also copies
parameters in and results out), and the same model written directly in JAX
(``benchmarks/models/gpt2_jax.py``, weights copied) under ``jax.jit``, at 2 and 6
layers; for scale, torch's own eager mode on CPU kernels, the same behind a Python
tensor subclass that only forwards to them (the floor of any eager mode dispatched in
Python, ``benchmarks/_subclass_floor.py``) and the JAX model run op by op
(not jitted: JAX's eager mode). For each: host ms/step (until the step call returns), this thread's CPU ms in
that call, and step ms (back-to-back steps, then a wait). Last, eager vs compile mode
on growing model sizes; and what packing the pure-JAX step's state into flat buffers
(one per kind instead of one per tensor) would buy in host time and cost in step time.
Prints medians and ratios; saves ``benchmarks/results/trace_overhead.png``. A
benchmark, not a test.

Usage: PYTHONPATH=. python benchmarks/trace_overhead.py [--n 2000] [--reps 7] [--skip-ops] [--eager-only]
[--packed-only]

``--eager-only``: just compile mode and eager mode (default and fused AdamW) on the 2-layer
model (host ms, CPU ms, step ms, eager ops per step) and the eager-vs-compile size table;
prints, saves nothing. ``--packed-only``: just the packed-state table; prints, saves nothing.
"""
from __future__ import annotations

import argparse
import copy
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import xla_dtensor  # noqa: I001  (sets up devices before jax)
import jax
import torch

from benchmarks.models import GPT2, GPT2Config


def chain(kind: str, x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    y = x
    for _ in range(n):
        if kind == "add":
            y = y + x
        elif kind == "mm":
            y = y @ w
        else:  # views of the same base (a view chain n deep costs O(n) in torch's own view tracking)
            y = x.view(64).view(8, 8)
    return y


def bench_ops(n: int, reps: int) -> dict[str, tuple[float, float]]:
    dev = xla_dtensor.device()
    x, w = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev) * 0.1
    xla_dtensor.sync()
    out = {}
    for kind in ("add", "mm", "view"):
        times, jit_times = [], []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            y = chain(kind, x, w, n)
            t1 = time.perf_counter()
            xla_dtensor.sync()
            del y
            times.append((t1 - t0) / n * 1e6)
        xs, ws = jax.numpy.asarray(x.cpu().numpy()), jax.numpy.asarray(w.cpu().numpy())

        def jf(a, b, kind=kind):
            y = a
            for _ in range(n):
                y = y + a if kind == "add" else (y @ b if kind == "mm" else a.reshape(64).reshape(8, 8))
            return y
        f = jax.jit(jf)
        f(xs, ws).block_until_ready()
        for _ in range(reps):
            t0 = time.perf_counter()
            r = f(xs, ws)
            jit_times.append((time.perf_counter() - t0) / n * 1e6)
            r.block_until_ready()
        out[kind] = (statistics.median(times[1:]), statistics.median(jit_times))
    return out


def _cfg(n_layer: int = 2) -> GPT2Config:
    return GPT2Config(vocab=128, n_positions=32, n_embd=64, n_layer=n_layer, n_head=4)


def _train_step(model, opt, x, y):  # noqa: ANN001, ANN202
    loss = model(x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _opt_step(opt):  # noqa: ANN001, ANN202
    opt.step()
    opt.zero_grad()


def _block(out) -> None:  # noqa: ANN001
    """Wait for a step's own results: JAX arrays directly, jax tensors through ``wait``."""
    if isinstance(out, jax.Array):
        out.block_until_ready()
    xla_dtensor.wait()


def _time_mode(step, reps: int, warm: int = 3) -> tuple[float, float, float]:  # noqa: ANN001
    """(median host ms until ``step()`` returns, median CPU ms of this thread in that call, ms per step of
    ``reps`` back-to-back steps).

    NOTE: every measurement starts with nothing in flight and ends by blocking on the
    mode's own results; ``xla_dtensor.wait()`` alone does not see a pure-JAX step's arrays,
    and the earlier version timed a backlog of unfinished JAX steps as part of the loop.
    The thread's CPU time is the host cost without the time the 2-core machine's other
    threads (XLA's workers, finishing the previous step) take the core away.
    """
    out = None
    for _ in range(warm):
        out = step()
    _block(out)
    host, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.thread_time()
        out = step()
        cpu.append((time.thread_time() - c0) * 1e3)
        host.append((time.perf_counter() - t0) * 1e3)
        _block(out)
    t0 = time.perf_counter()
    for _ in range(reps):
        out = step()
    _block(out)
    if isinstance(out, torch.Tensor):
        out.item()
    return statistics.median(host), statistics.median(cpu), (time.perf_counter() - t0) * 1e3 / reps


OVERHEAD: dict[str, tuple[float, float, int]] = {}


def _replay_overhead(cstep, args: tuple, reps: int) -> tuple[float, float, int]:  # noqa: ANN001
    """(median ms of the replay's own Python: gather + rebind, median ms of the executable call, inputs)."""
    from xla_dtensor.jit.args import signature
    flat: list = []
    entry = cstep._entries[signature(args, {}, flat)]
    py, call = [], []
    for _ in range(reps):
        xla_dtensor.wait()
        t0 = time.perf_counter()
        inputs = entry.gather(flat)
        t1 = time.perf_counter()
        results = entry.compiled(*inputs)
        t2 = time.perf_counter()
        jax.block_until_ready(results)
        t3 = time.perf_counter()
        entry.apply(results, flat)
        t4 = time.perf_counter()
        py.append((t1 - t0 + t4 - t3) * 1e3)
        call.append((t2 - t1) * 1e3)
    return statistics.median(py), statistics.median(call), len(inputs)


ASYNC: dict[str, float] = {}


def _async_probe(trace, reps: int) -> dict[str, float]:  # noqa: ANN001
    """Median ms inside ``sync()`` and from its return until the results are ready (the program in flight)."""
    call, flight = [], []
    for _ in range(reps):
        trace()
        t0 = time.perf_counter()
        xla_dtensor.sync()
        t1 = time.perf_counter()
        xla_dtensor.wait()
        call.append((t1 - t0) * 1e3)
        flight.append((time.perf_counter() - t1) * 1e3)
    return {"sync": statistics.median(call), "in flight": statistics.median(flight)}


def _reused(model: GPT2, times: int) -> GPT2:
    """``model`` running its blocks ``times`` over: ``times`` x the ops, the same parameters and state."""
    model.h = torch.nn.ModuleList(list(model.h) * times)
    return model


def bench_modes(reps: int) -> dict[str, tuple[float, float, float]]:
    from benchmarks.models import gpt2_jax
    dev = xla_dtensor.device()
    torch.manual_seed(0)
    base = GPT2(_cfg())
    idx = torch.randint(0, 128, (4, 32))
    d = idx.to(dev)
    res = {}

    m = copy.deepcopy(base).to(dev)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-3)

    def lazy_step():  # noqa: ANN202
        loss = _train_step(m, opt, d, d)
        xla_dtensor.sync()
        return loss
    res["lazy"] = _time_mode(lazy_step, reps)

    def lazy_wait():  # noqa: ANN202  (no overlap: block on each step before tracing the next)
        loss = lazy_step()
        xla_dtensor.wait()
        return loss
    res["lazy, wait each step"] = _time_mode(lazy_wait, reps)
    ASYNC.update(_async_probe(lambda: _train_step(m, opt, d, d), reps))

    for name, make in (("compile", lambda: copy.deepcopy(base)),
                       ("compile, 3x ops", lambda: _reused(copy.deepcopy(base), 3)),
                       ("compile (6 layers)", lambda: GPT2(_cfg(6)))):
        torch.manual_seed(0)
        mc = make().to(dev)
        optc = torch.optim.AdamW(mc.parameters(), lr=1e-3)
        cstep = xla_dtensor.compile(_train_step)
        res[name] = _time_mode(lambda: cstep(mc, optc, d, d), reps)
        OVERHEAD[name] = _replay_overhead(cstep, (mc, optc, d, d), reps)

    me = copy.deepcopy(base).to(dev)
    opte = torch.optim.AdamW(me.parameters(), lr=1e-3)
    mf = copy.deepcopy(base).to(dev)
    optf = torch.optim.AdamW(mf.parameters(), lr=1e-3, fused=True)
    mo = copy.deepcopy(base).to(dev)
    opto = torch.optim.AdamW(mo.parameters(), lr=1e-3)
    ostep = xla_dtensor.compile(_opt_step)

    def eager_compiled_opt():  # noqa: ANN202  (the eager workflow: forward and backward op by op, compiled step)
        loss = mo(d, d)
        loss.backward()
        ostep(opto)
        return loss
    xla_dtensor.eager_mode(True)
    try:
        res["eager"] = _time_mode(lambda: _train_step(me, opte, d, d), reps)
        res["eager, fused AdamW"] = _time_mode(lambda: _train_step(mf, optf, d, d), reps)
        res["eager, compiled opt"] = _time_mode(eager_compiled_opt, reps)
    finally:
        xla_dtensor.eager_mode(False)

    from xla_dtensor import dynamo_backend  # noqa: F401  (registers the backend)
    mt = copy.deepcopy(base)
    cm = torch.compile(mt, backend="xla_dtensor")
    optt = torch.optim.AdamW(mt.parameters(), lr=1e-3, foreach=True)
    res["torch.compile"] = _time_mode(lambda: _train_step(cm, optt, idx, idx), reps)

    # compile mode and JAX from the same weights, for the interleaved comparison and the loss check
    mcj = copy.deepcopy(base).to(dev)
    optj = torch.optim.AdamW(mcj.parameters(), lr=1e-3)
    cstep2 = xla_dtensor.compile(_train_step)
    jstep = gpt2_jax.make_train_step(base.cfg.n_head, lr=1e-3, wd=0.01)
    ji = jax.numpy.asarray(idx.numpy())
    jax_step, JAX_LEAVES["pure JAX"] = _jax_runner(jstep, base, ji)
    res["pure JAX"] = _time_mode(jax_step, reps)
    torch.manual_seed(0)
    jax_step6, JAX_LEAVES["pure JAX (6 layers)"] = _jax_runner(jstep, GPT2(_cfg(6)), ji)
    res["pure JAX (6 layers)"] = _time_mode(jax_step6, reps)
    jax_step2, _ = _jax_runner(jstep, base, ji)
    jax_step3, _ = _jax_runner(jstep, base, ji, per_param_steps=True)  # torch's optimizer math
    from xla_dtensor.jit.args import signature
    flat: list = []
    cstep2(mcj, optj, d, d)
    cstep2(mcj, optj, d, d)  # the first two calls trace (no state, then state): now cached
    for _ in range(2):  # the same number of steps on all, so the next losses must agree
        jax_step2()
        jax_step3()
    entry = cstep2._entries[signature((mcj, optj, d, d), {}, flat)]

    def program_only() -> float:  # the compile-mode executable alone: gather, then time the run, rebind
        inputs = entry.gather(flat)
        t0 = time.perf_counter()
        results = jax.block_until_ready(entry.compiled(*inputs))
        t = (time.perf_counter() - t0) * 1e3
        entry.apply(results, flat)
        return t
    FAIR.update(_fair_compare(lambda: cstep2(mcj, optj, d, d), jax_step2, jax_step3, max(6 * reps, 60),
                              program_only))
    # for scale, run last: with these two before it, the comparison above timed slower JAX steps
    # (2.55-2.68 ms against 2.24-2.47 ms; cause not isolated)
    mn = copy.deepcopy(base)  # the reference for eager mode: torch's own eager on CPU kernels, no subclass
    optn = torch.optim.AdamW(mn.parameters(), lr=1e-3)
    res["torch eager (CPU)"] = _time_mode(lambda: _train_step(mn, optn, idx, idx), reps)
    res.update(_floor_modes(base, idx, reps))
    raw = gpt2_jax.make_train_step(base.cfg.n_head, lr=1e-3, wd=0.01, jit=False)
    jax_eager, _ = _jax_runner(raw, base, ji)  # not jitted: JAX's own eager mode, every primitive alone
    res["pure JAX, op by op"] = _time_mode(jax_eager, min(reps, 5), warm=2)
    return res


def _floor_modes(base: GPT2, idx: torch.Tensor, reps: int) -> dict[str, tuple[float, float, float]]:
    """The eager floor rows: the step on torch's CPU kernels seen through a Python subclass that only
    forwards (``benchmarks/_subclass_floor.py``), with foreach and with fused AdamW (eager mode's two
    optimizer paths)."""
    from benchmarks._subclass_floor import PassThrough, wrap_parameters
    x = PassThrough(idx)
    res = {}
    for name, kw in (("subclass floor", {"foreach": True}), ("subclass floor, fused", {"fused": True})):
        m = wrap_parameters(copy.deepcopy(base))
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, **kw)
        res[name] = _time_mode(lambda m=m, opt=opt: _train_step(m, opt, x, x), reps)
    return res


FAIR: dict[str, float] = {}
JAX_LEAVES: dict[str, int] = {}


def _jax_runner(step: Any, model: GPT2, ji: Any, per_param_steps: bool = False) -> tuple[Callable[[], Any], int]:
    """A call of ``step`` on ``model``'s weights with ``ji`` as inputs and targets, carrying its
    parameters and AdamW state from call to call; and its number of program inputs besides the batch."""
    from benchmarks.models import gpt2_jax
    params = gpt2_jax.params_from_torch(model)
    box = [params, gpt2_jax.adamw_init(params, per_param_steps)]
    n_inputs = len(jax.tree.leaves(box))

    def run() -> Any:
        box[0], box[1], loss = step(box[0], box[1], ji, ji)
        return loss
    return run, n_inputs


def _interleaved(runs: dict[str, Callable[[], Any]], reps: int) -> dict[str, list[Any]]:
    """Each run's results over ``reps`` rounds of one call of each, in a new seeded order every
    round (see :func:`_fair_compare` for why)."""
    names, rng = list(runs), random.Random(0)
    out: dict[str, list[Any]] = {k: [] for k in runs}
    for _ in range(reps):
        rng.shuffle(names)
        for k in names:
            out[k].append(runs[k]())
    return out


def _ms_to_completion(run: Callable[[], Any]) -> Callable[[], float]:
    """``run`` (which returns once its step has completed), timed: ms per call."""
    def timed() -> float:
        t0 = time.perf_counter()
        run()
        return (time.perf_counter() - t0) * 1e3
    return timed


def _fair_compare(cstep, jstep, jstep_counts, reps: int, program_only) -> dict[str, float]:  # noqa: ANN001
    """Compile mode vs pure JAX, interleaved step by step on the same machine state.

    Both run the same model from the same weights on the same single device, float32,
    AdamW inside the program, parameters and optimizer state donated, batch not; both
    warmed up. ``jstep_counts`` is the JAX step with one step count per parameter, as
    torch's AdamW keeps them (the same optimizer math as compile mode's program). Each
    step is timed from the call to its completion (``block_until_ready`` / ``wait``), one
    of each per round so load on the shared machine hits all alike, in a new seeded order
    every round: a step's time depends on what ran before it (whose data is in the
    caches), and a fixed order gave one of them that advantage every round (the same bias
    ``_hlo_stats.time_interleaved`` removes).
    """
    from xla_dtensor.core.executor import materialize

    def run_compile() -> None:
        # NOTE: the loss's own array (one program: all its outputs finish together); wait() would
        # also walk every live storage of the other modes' models
        jax.block_until_ready(materialize(cstep()))
    first = (float(cstep().item()), float(jstep()), float(jstep_counts()))  # the same step from the same weights
    for _ in range(5):
        cstep()
        jstep()
        jstep_counts()
    xla_dtensor.wait()
    times = _interleaved({"compile": _ms_to_completion(run_compile),
                          "JAX": _ms_to_completion(lambda: jax.block_until_ready(jstep())),
                          "JAX counts": _ms_to_completion(lambda: jax.block_until_ready(jstep_counts())),
                          "program": program_only}, reps)
    return {**{k: statistics.median(v) for k, v in times.items()},
            "loss compile": first[0], "loss JAX": first[1], "loss JAX counts": first[2]}


EAGER_SIZES = ((64, 32, 4), (128, 64, 8), (256, 128, 8))  # (n_embd, sequence, batch), 2 layers


Sizes = list[tuple[tuple[int, int, int], float, float, float]]


def bench_eager_sizes(reps: int, sizes: tuple = EAGER_SIZES) -> Sizes:
    """Eager vs compile mode as the model grows: ``[(size, compile ms, eager ms, eager fused ms)]``, medians.

    The three run interleaved step by step from the same weights, each timed to completion, in a
    new seeded order every round (a fixed order favoured one of them, see ``_fair_compare``):
    compile mode and eager mode with the default (multi-tensor) AdamW, and eager mode with
    ``AdamW(fused=True)`` (one op per optimizer step instead of ~12). Eager mode pays a
    fixed host cost per op (one cached executable call each); it matters less as each
    op's work grows.
    """
    dev = xla_dtensor.device()
    out = []
    for e, t, b in sizes:
        torch.manual_seed(0)
        base = GPT2(GPT2Config(vocab=256, n_positions=t, n_embd=e, n_layer=2, n_head=4))
        x, y = torch.randint(0, 256, (b, t)).to(dev), torch.randint(0, 256, (b, t)).to(dev)
        mc, me, mf = (copy.deepcopy(base).to(dev) for _ in range(3))
        oc, oe = torch.optim.AdamW(mc.parameters(), lr=1e-3), torch.optim.AdamW(me.parameters(), lr=1e-3)
        of = torch.optim.AdamW(mf.parameters(), lr=1e-3, fused=True)
        cstep = xla_dtensor.compile(_train_step)

        def eager(model: GPT2, opt: torch.optim.Optimizer) -> torch.Tensor:
            xla_dtensor.eager_mode(True)
            try:
                return _train_step(model, opt, x, y)
            finally:
                xla_dtensor.eager_mode(False)
        for _ in range(3):
            cstep(mc, oc, x, y)
            eager(me, oe)
            eager(mf, of)
        xla_dtensor.wait()
        steps = {"compile": lambda: cstep(mc, oc, x, y), "eager": lambda: eager(me, oe), "fused": lambda: eager(mf, of)}
        times = _interleaved({k: _ms_to_completion(lambda f=f: _item_and_wait(f())) for k, f in steps.items()}, reps)
        tc, te, tf = times["compile"], times["eager"], times["fused"]
        lc, le, lf = cstep(mc, oc, x, y).item(), eager(me, oe).detach().item(), eager(mf, of).detach().item()
        for name, got in (("eager", le), ("eager with fused AdamW", lf)):
            if abs(lc - got) > 1e-4 * max(1.0, abs(lc)):
                raise AssertionError(f"{name} and compile losses differ at size {(e, t, b)}: {got} vs {lc}")
        out.append(((e, t, b), statistics.median(tc), statistics.median(te), statistics.median(tf)))
    return out


def _item_and_wait(loss: torch.Tensor) -> None:
    """Read a step's loss on the host, then wait for everything pending."""
    loss.item()
    xla_dtensor.wait()


Packed = dict[int, dict[str, tuple[float, float, float]]]


def bench_packed(reps: int, layers: tuple[int, ...] = (2, 6)) -> Packed:
    """What packing the state into flat buffers would buy and cost, measured on the pure-JAX step.

    Per layer count: ``{"separate" | "packed": (host CPU ms of the call, ms timed to
    completion, ms a step back to back)}``, medians (:func:`_cpu_done_b2b`); the two run
    interleaved in a new seeded order every round, from the same weights, and their losses
    must agree. ``packed`` is
    :func:`gpt2_jax.make_packed_train_step` (4 state buffers instead of one per parameter,
    moment and step count): the per-buffer host cost of a call goes, but the program now
    slices and concatenates the whole state every step.
    """
    from benchmarks.models import gpt2_jax
    out: Packed = {}
    for n_layer in layers:
        torch.manual_seed(0)
        model = GPT2(_cfg(n_layer))
        ji = jax.numpy.asarray(torch.randint(0, 128, (4, 32)).numpy())
        sep, _ = _jax_runner(gpt2_jax.make_train_step(model.cfg.n_head, lr=1e-3, wd=0.01), model, ji)
        pstep, box = gpt2_jax.make_packed_train_step(model.cfg.n_head, gpt2_jax.params_from_torch(model))

        def packed() -> Any:
            *state, loss = pstep(*box, ji, ji)
            box[:] = state
            return loss
        for run in (sep, packed):
            for _ in range(3):
                jax.block_until_ready(run())
        rounds = _interleaved({"separate": lambda: _cpu_done_b2b(sep), "packed": lambda: _cpu_done_b2b(packed)}, reps)
        ls, lp = float(sep()), float(packed())
        if abs(ls - lp) > 1e-5 * max(1.0, abs(ls)):
            raise AssertionError(f"packed and separate state give different losses at {n_layer} layers: {lp} vs {ls}")
        out[n_layer] = {k: tuple(statistics.median(col) for col in zip(*v)) for k, v in rounds.items()}
    return out


def _cpu_done_b2b(run: Callable[[], Any]) -> tuple[float, float, float]:
    """One step of ``run`` (a pure-JAX step returning its loss): this thread's CPU ms in the call
    and ms to completion; then ms a step over 10 back to back."""
    t0, c0 = time.perf_counter(), time.thread_time()
    loss = run()
    cpu = (time.thread_time() - c0) * 1e3
    jax.block_until_ready(loss)
    done = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for _ in range(10):
        loss = run()
    jax.block_until_ready(loss)
    return cpu, done, (time.perf_counter() - t0) / 10 * 1e3


def _packed_table(packed: Packed) -> list[str]:
    """The lines of :func:`bench_packed`'s table."""
    lines = [f"{'layers':<8}{'state':<10}{'host CPU ms':>12}{'to completion ms':>18}{'back to back ms':>17}"]
    for n_layer, rows in packed.items():
        for k, (c, d, b) in rows.items():
            lines.append(f"{n_layer:<8}{k:<10}{c:>12.3f}{d:>18.3f}{b:>17.3f}")
        (cs, ds, bs), (cp, dp, bp) = rows["separate"], rows["packed"]
        lines.append(f"{'':<8}{'packed/sep':<10}{cp / cs:>12.2f}{dp / ds:>18.2f}{bp / bs:>17.2f}")
    return lines


def _eager_only(reps: int) -> None:
    """Compile mode vs eager mode (default and fused AdamW) on the default model, then the size
    table (``--eager-only``)."""
    from xla_dtensor import metrics
    dev = xla_dtensor.device()
    torch.manual_seed(0)
    base = GPT2(_cfg())
    d = torch.randint(0, 128, (4, 32)).to(dev)
    mc, me, mf = (copy.deepcopy(base).to(dev) for _ in range(3))
    oc, oe = torch.optim.AdamW(mc.parameters(), lr=1e-3), torch.optim.AdamW(me.parameters(), lr=1e-3)
    of = torch.optim.AdamW(mf.parameters(), lr=1e-3, fused=True)
    cstep = xla_dtensor.compile(_train_step)
    res = {"compile": _time_mode(lambda: cstep(mc, oc, d, d), max(reps, 10))}
    n_ops = {}
    xla_dtensor.eager_mode(True)
    try:
        for name, m, o in (("eager", me, oe), ("eager, fused AdamW", mf, of)):
            res[name] = _time_mode(lambda m=m, o=o: _train_step(m, o, d, d), max(reps, 10))
            before = metrics.snapshot()
            _train_step(m, o, d, d)
            n_ops[name] = metrics.diff(before)["eager_ops"]
    finally:
        xla_dtensor.eager_mode(False)
    res.update(_floor_modes(base, d.cpu(), max(reps, 10)))
    print("GPT-2 train step (2 layers, n_embd 64, batch 4x32, AdamW), medians")
    print(f"{'mode':<20}{'host ms/step':>13}{'host CPU ms':>12}{'step ms':>9}{'eager ops':>10}"
          f"{'throughput vs compile':>23}")
    for k, (h, cpu, st) in res.items():
        print(f"{k:<20}{h:>13.3f}{cpu:>12.3f}{st:>9.3f}{n_ops.get(k, 0):>10}{res['compile'][2] / st:>23.2f}")
    print("\n".join(_size_table(bench_eager_sizes(reps))))


def _size_table(sizes: Sizes) -> list[str]:
    """The lines of the eager-vs-compile table of :func:`bench_eager_sizes`' results."""
    lines = [f"{'n_embd x seq x batch':<22}{'compile ms':>11}{'eager ms':>10}{'eager fused ms':>16}"
             f"{'eager throughput vs compile':>29}{'eager fused vs compile':>24}"]
    return lines + [f"{f'{e} x {t} x {b}':<22}{c:>11.2f}{ea:>10.2f}{ef:>16.2f}{c / ea:>29.2f}{c / ef:>24.2f}"
                    for (e, t, b), c, ea, ef in sizes]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--skip-ops", action="store_true", help="only the per-mode GPT-2 step tables")
    ap.add_argument("--eager-only", action="store_true", help="only compile vs eager mode; prints, saves nothing")
    ap.add_argument("--packed-only", action="store_true", help="only the packed-state table; prints, saves nothing")
    a = ap.parse_args()
    if a.packed_only:
        print("\n".join(_packed_table(bench_packed(max(a.reps, 10) * 2))))
        return
    if a.eager_only:
        _eager_only(max(a.reps, 5))
        return
    out_lines: list[str] = []

    def say(text: str = "") -> None:  # printed, and kept for results/trace_overhead.md
        print(text)
        out_lines.append(text)

    ops = {} if a.skip_ops else bench_ops(a.n, a.reps)
    if ops:
        say(f"{'op':<6}{'lazy us/op':>12}{'jax.jit us/op':>15}{'ratio':>8}")
        for k, (lazy, jit) in ops.items():
            say(f"{k:<6}{lazy:>12.2f}{jit:>15.3f}{lazy / jit:>8.1f}")
    modes = bench_modes(max(a.reps, 10))
    jstep = modes["pure JAX"][2]
    ctput = modes["compile"][2]
    say("\nGPT-2 train step (2 layers unless named, n_embd 64, batch 4x32, AdamW), medians")
    say(f"{'mode':<22}{'host ms/step':>13}{'host CPU ms':>12}{'step ms':>9}{'step / JAX':>11}"
        f"{'throughput vs compile':>23}")
    for k, (h, cpu, st) in modes.items():
        say(f"{k:<22}{h:>13.3f}{cpu:>12.3f}{st:>9.3f}{st / jstep:>11.2f}{ctput / st:>23.2f}")
    say("(host CPU ms: this thread's CPU time inside the step call; compile, 3x ops: the same 2 blocks run 3 times, "
        "so 3x the ops with the same parameters and state)")
    for k, (py, call, n_in) in OVERHEAD.items():
        say(f"{k}: {n_in} program inputs; replay Python (gather inputs + rebind results) {py:.3f} ms; "
            f"executable call (host; on CPU it may run inline) {call:.3f} ms")
    say(f"pure JAX: {JAX_LEAVES['pure JAX']} / {JAX_LEAVES['pure JAX (6 layers)']} program inputs at 2 / 6 layers "
        f"(one AdamW step count; torch keeps one per parameter)")
    say(f"interleaved, each step timed to completion (median): compile {FAIR['compile']:.3f} ms, pure JAX "
        f"{FAIR['JAX']:.3f} ms, ratio {FAIR['compile'] / FAIR['JAX']:.2f}; losses of step 3 "
        f"{FAIR['loss compile']:.6g} vs {FAIR['loss JAX']:.6g} (targets = inputs: tied embeddings make it small)")
    say(f"  of which the compile-mode executable alone (no replay Python): {FAIR['program']:.3f} ms, "
        f"{FAIR['program'] / FAIR['JAX']:.2f}x the JAX step")
    say(f"  pure JAX with a step count per parameter (torch AdamW's math): {FAIR['JAX counts']:.3f} ms; compile "
        f"mode is {FAIR['compile'] / FAIR['JAX counts']:.2f}x it (loss {FAIR['loss JAX counts']:.6g})")
    lz, lw = modes["lazy"], modes["lazy, wait each step"]
    say(f"asynchrony: a lazy step's sync() returns after {ASYNC['sync']:.3f} ms with its program still running "
        f"for {ASYNC['in flight']:.3f} ms; back to back the steps take {lz[2]:.3f} ms vs {lw[2]:.3f} ms when each "
        f"is waited for before the next is traced (on 2 cores XLA's workers and the tracing thread share the "
        f"machine, so little of the overlap shows as throughput)")
    sizes = bench_eager_sizes(max(a.reps, 5))
    say("\nEager vs compile mode by model size (GPT-2, 2 layers, AdamW; interleaved medians; losses equal)")
    for line in _size_table(sizes):
        say(line)
    packed = bench_packed(max(a.reps, 10) * 2)
    say("\nPure JAX with its state packed into flat buffers (parameters, first and second moments: one buffer "
        "each) vs one buffer per tensor; interleaved medians, losses equal")
    for line in _packed_table(packed):
        say(line)
    say("\ntargets")
    say(f"  compile-mode host CPU <= 1 ms/step: 2 layers {modes['compile'][1]:.3f} ms, 3x ops "
        f"{modes['compile, 3x ops'][1]:.3f} ms, 6 layers {modes['compile (6 layers)'][1]:.3f} ms "
        f"(pure JAX itself: {modes['pure JAX'][1]:.3f} / {modes['pure JAX (6 layers)'][1]:.3f} ms at 2 / 6 layers)")
    p6 = packed[max(packed)]
    say(f"    packing the state would take pure JAX at {max(packed)} layers from {p6['separate'][0]:.3f} to "
        f"{p6['packed'][0]:.3f} ms of host CPU, at {p6['packed'][2] / p6['separate'][2]:.2f}x its back-to-back "
        f"step time on XLA CPU")
    say(f"  compile-mode step <= 1.05x pure JAX: {FAIR['compile'] / FAIR['JAX']:.2f}x (interleaved)")
    say("  eager >= 0.4x compile throughput (size table: each step timed to completion, .item() included): "
        + ", ".join(f"{e}x{t}x{b} {c / ea:.2f} ({c / ef:.2f} with fused AdamW)" for (e, t, b), c, ea, ef in sizes))
    say(f"    back to back (first table), 64x32x4: eager {ctput / modes['eager'][2]:.2f}, fused AdamW "
        f"{ctput / modes['eager, fused AdamW'][2]:.2f}, compiled optimizer step "
        f"{ctput / modes['eager, compiled opt'][2]:.2f}")
    say(f"    for scale, 64x32x4: JAX's own op-by-op mode runs at {jstep / modes['pure JAX, op by op'][2]:.3f}x "
        f"of its jit; eager mode is {modes['pure JAX, op by op'][2] / modes['eager'][2]:.1f}x faster than it; "
        f"torch's own CPU eager step is {modes['torch eager (CPU)'][2]:.2f} ms")
    say(f"    the floor of a Python-subclass eager mode, 64x32x4: torch's CPU kernels behind a subclass that only "
        f"forwards run at {ctput / modes['subclass floor'][2]:.2f} (foreach AdamW) / "
        f"{ctput / modes['subclass floor, fused'][2]:.2f} (fused) of compile mode's throughput, before any "
        f"executable call or bookkeeping")
    _plot(ops, modes, sizes)
    out = Path(__file__).resolve().parent / "results" / "trace_overhead.png"
    table = out.with_suffix(".md")
    table.write_text("# trace_overhead\n\nOutput of `PYTHONPATH=. python benchmarks/trace_overhead.py "
                     f"{' '.join(sys.argv[1:])}` (medians; the run that saved trace_overhead.png).\n\n"
                     "```\n" + "\n".join(out_lines).strip() + "\n```\n")
    print(f"saved {out} and {table}")


def _plot(ops: dict, modes: dict, sizes: list) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 4 if ops else 3, figsize=(17 if ops else 13, 4.2))
    ax = list(ax)
    if ops:
        kinds = list(ops)
        ax[0].bar([i - 0.2 for i in range(3)], [ops[k][0] for k in kinds], 0.4, label="lazy core")
        ax[0].bar([i + 0.2 for i in range(3)], [ops[k][1] for k in kinds], 0.4, label="jax.jit")
        ax[0].set_xticks(range(3), kinds)
        ax[0].set_ylabel("host us / op")
        ax[0].legend()
        ax = ax[1:]
    names = list(modes)
    ax[0].bar(names, [modes[k][1] for k in names])
    ax[0].set_yscale("log")
    ax[0].set_ylabel("host CPU ms / GPT-2 step")
    ax[1].bar(names, [modes[k][2] for k in names])
    ax[1].set_yscale("log")
    ax[1].set_ylabel("ms / GPT-2 step (back to back)")
    for x in ax[:2]:
        x.tick_params(axis="x", rotation=40, labelsize=7)
    labels = [f"{e}x{t}x{b}" for (e, t, b), *_ in sizes]
    for j, name in enumerate(("compile", "eager", "eager, fused AdamW")):
        ax[2].bar([i + (j - 1) * 0.27 for i in range(len(sizes))], [row[1 + j] for row in sizes], 0.27, label=name)
    ax[2].set_xticks(range(len(sizes)), labels)
    ax[2].set_xlabel("n_embd x seq x batch")
    ax[2].set_ylabel("ms / step")
    ax[2].set_yscale("log")
    ax[2].legend()
    fig.tight_layout()
    fig.savefig(Path(__file__).resolve().parent / "results" / "trace_overhead.png", dpi=120)


if __name__ == "__main__":
    main()
