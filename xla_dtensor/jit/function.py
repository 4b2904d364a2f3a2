"""``xla_dtensor.compile(fn)``: trace once per input signature, then replay the executable.

Assumptions (documented in docs/fastpaths.md, "the trace-once contract"): ``fn``'s graph
is a function of its signature only, i.e. no Python control flow on tensor values and no
hidden Python state feeding the graph; the Python scalars and small containers ``fn``
reads from its own globals and closure are part of the signature
(:mod:`xla_dtensor.jit.hidden`). Violations detected: host reads of device values while
tracing (the function then runs lazily every call, with a warning) and, every
``config.compile_check_every`` replays, a re-trace whose graph or constants differ
from the cached ones (a :class:`GraphChangedWarning` naming the first differing op;
that signature is then traced on every call).
"""
from __future__ import annotations

import functools
import time
import warnings
from typing import Any, Callable

import jax
import torch

from xla_dtensor import metrics
from xla_dtensor.jit import hyper, layouts, replay
from xla_dtensor.jit.args import describe_change, signature
from xla_dtensor.jit.capture import capture, make_capturable, share_equal_scalars
from xla_dtensor.jit.hidden import Hidden
from xla_dtensor.config import config
from xla_dtensor.core import executor, state, threads
from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.debug import analysis
from xla_dtensor.debug import metrics_report as timing

for _name in ("compile_traces", "compile_replays", "compile_rechecks", "compile_lazy_calls"):
    metrics._COUNTS.setdefault(_name, 0)


class GraphChangedWarning(UserWarning):
    """A compiled function recorded a different graph for the same input signature."""


class DataDependentWarning(UserWarning):
    """A compiled function read device values on the host while tracing."""


class UnevenLayoutWarning(UserWarning):
    """A compiled function reads or writes an unevenly sharded tensor: it runs lazily."""


class FreedInputWarning(UserWarning):
    """A compiled function read a tensor that it freed and that no argument reaches."""


class RetraceWarning(UserWarning):
    """A compiled function keeps tracing new signatures (more than ``config.compile_cache_size``)."""


class HyperparameterWarning(UserWarning):
    """A compiled function's optimizer hyperparameters could not become program inputs."""


_CLEAN: dict[int, tuple[int, int]] = {}  # per thread (core.threads owner): the op counts when it had nothing pending


def _pending() -> bool:
    c = metrics._COUNTS
    return (c["ops_recorded"], c["hash_cons_hits"]) != _CLEAN.get(threads.me())


def _mark_clean() -> None:
    c = metrics._COUNTS
    _CLEAN[threads.me()] = (c["ops_recorded"], c["hash_cons_hits"])


class CompiledFunction:
    """The callable returned by :func:`compile`."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self._fn = fn
        self._entries: dict[tuple, replay.Entry] = {}
        self._lazy: set[tuple] = set()
        self._unshared: set[tuple] = set()  # signatures whose equal optimizer scalars must not share a value
        self._last_sig: tuple | None = None
        self._static_hyper = False  # a trace could not make the hyperparameters inputs: they are signature values
        self._evicted = 0
        self._name = getattr(fn, "__qualname__", repr(fn))
        self._hidden = Hidden(fn)
        functools.update_wrapper(self, fn)

    @threads.locked  # NOTE: a whole call: no other thread's op may land in a trace or between gather and rebind
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        flat: list = []
        sig = signature(args, kwargs, flat, self._hidden.key(), self._static_hyper)
        e = self._entries.get(sig)
        if e is not None and not e.always_trace:
            e.calls += 1
            every = config.compile_check_every
            if not every or e.calls % every:
                t0 = time.perf_counter()
                if _pending():
                    executor.sync()
                inputs = e.gather(flat)
                if type(inputs) is list and state.STATE.multi and e.donate and \
                        executor.foreign_reads([inputs[i] for i in e.donate]):
                    executor.sync(all_threads=True)  # another thread's pending value reads a buffer donated here
                    inputs = e.gather(flat)
                if type(inputs) is list:
                    if len(self._entries) > 1:
                        self._entries[sig] = self._entries.pop(sig)  # most recently used last
                    out = e.apply(e.compiled(*inputs), flat)
                    c = metrics._COUNTS
                    c["compile_replays"] += 1
                    c["executions"] += 1
                    _CLEAN[threads.me()] = (c["ops_recorded"], c["hash_cons_hits"])
                    timing.record("replay_host", time.perf_counter() - t0)
                    if state.STATE.debugging:
                        analysis.event("execute", "compile call (replay)", hash(e.struct), e.n_in, e.n_out,
                                       site=self._name)
                    return out
                reason = f"retrace: {inputs}"
                if type(inputs) is replay.Recheck:
                    reason = f"periodic re-check: {inputs}"
                elif type(inputs) is replay.NewProgram:
                    e = None  # a different program on purpose (separate inputs), not a changed graph
                    del self._entries[sig]
            else:
                reason = "periodic re-check (config.compile_check_every)"
        elif sig in self._lazy:
            return self._run_lazily(sig, flat, args, kwargs)
        elif e is None:
            if self._last_sig is None:
                reason = "first call"
            elif sig == self._last_sig:
                reason = "the previous call was not cached (it created state tensors or settled layouts)"
            else:
                reason = f"new input signature: {describe_change(self._last_sig, sig)}"
        else:
            reason = "graph changed earlier: traced on every call"
        return self._trace(sig, flat, args, kwargs, reason, e)

    def _lazy_from_now(self, sig: tuple, out: Any, why: Warning) -> Any:
        """Warn ``why``, run this call's graph, and run ``sig`` lazily (traced) from now on."""
        warnings.warn(why, stacklevel=4)
        self._lazy.add(sig)
        executor.sync(pre_hooks=False)  # capture ran them
        _mark_clean()
        return out

    def _run_lazily(self, sig: tuple, flat: list, args: tuple, kwargs: dict) -> Any:
        """Run ``fn`` lazily, its equal optimizer scalars shared as when it was traced (the same
        programs as the traced call's, so a lazy signature compiles nothing after it)."""
        metrics._COUNTS["compile_lazy_calls"] += 1
        if sig not in self._unshared:
            share_equal_scalars(flat)
        with torch.autograd.set_multithreading_enabled(False):  # NOTE: backward here: torch's thread waits for the lock
            out = self._fn(*args, **kwargs)
        executor.sync(pack=False)  # NOTE: the traced call's programs take and give each state tensor alone
        _mark_clean()
        return out

    def _trace(self, sig: tuple, flat: list, args: tuple, kwargs: dict, reason: str, old: replay.Entry | None) -> Any:
        make_capturable(flat)
        flat = []
        sig = signature(args, kwargs, flat, self._hidden.key(), self._static_hyper)
        old = self._entries.get(sig, old)
        from xla_dtensor.eager import suspended
        executor.sync(all_threads=True)  # NOTE: a pending value of any thread read by fn would be traced as a constant
        layouts.settle_hyperparameters(x for x in flat if isinstance(x, torch.optim.Optimizer))
        if sig not in self._unshared:
            share_equal_scalars(flat)
        t0 = time.perf_counter()
        # NOTE: backward on this thread: torch's autograd thread would wait for the lock this call holds
        where = [] if self._static_hyper else hyper.bases(flat)
        with suspended(), torch.autograd.set_multithreading_enabled(False), hyper.recording() as rec:
            with hyper.substituted(flat, where):
                watch = where or any(isinstance(x, torch.optim.Optimizer) for x in flat)
                cap, out = capture(_watched(self._fn, rec) if watch else self._fn, args, kwargs, flat)
        timing.record("trace", time.perf_counter() - t0)
        if where and rec.escapes:
            self._static_hyper = True
            warnings.warn(HyperparameterWarning(
                f"compile({self._name}): {rec.escapes[0]}; the optimizers' float hyperparameters stay values "
                f"of the signature (a changed value traces, and may compile, a program of its own)"), stacklevel=3)
            sig = signature(args, kwargs, [], self._hidden.key(), True)
            old = self._entries.get(sig)
        elif where:
            _hyper_sources(cap, rec, where, hyper.values(flat, where))
        del rec
        recheck = old is not None and reason.startswith("periodic")
        metrics._COUNTS["compile_rechecks" if recheck else "compile_traces"] += 1
        if cap.host_reads:
            return self._lazy_from_now(sig, out, DataDependentWarning(
                f"compile({self._name}): the function read {cap.host_reads} device value(s) computed from its "
                f"inputs (arguments, parameters, state) on the host while tracing (.item(), .cpu(), print, Python "
                f"control flow on tensors); its graph may depend on data, so it runs lazily (traced) on every call "
                f"with this signature"))
        if cap.freed:
            shapes = ", ".join(str(list(sh)) for sh in cap.freed[:3]) + (", ..." if len(cap.freed) > 3 else "")
            return self._lazy_from_now(sig, out, FreedInputWarning(
                f"compile({self._name}): the function read {len(cap.freed)} tensor(s) (shape {shapes}) that it "
                f"freed and that no argument, parameter gradient or live tensor reaches, so a later call could not "
                f"find their values; it runs lazily (traced) on every call with this signature. Pass such "
                f"tensors as arguments"))
        if cap.uneven:
            return self._lazy_from_now(sig, out, UnevenLayoutWarning(
                f"compile({self._name}): the function reads or writes {cap.uneven} unevenly sharded tensor(s) (a dim "
                f"not divisible by its shard count, held padded); compiled programs do not replay those yet, so it "
                f"runs lazily (traced) on every call with this signature"))
        if cap.split_merge:  # equal scalars shared for this trace were written with different values
            self._unshared.add(sig)
            analysis.event("trace", f"compile call ({reason}; shared equal scalars diverged: not cached, traced "
                           f"again without sharing)", hash(cap.struct), len(cap.leaves), len(cap.roots),
                           site=self._name, force=True)
            executor.sync(pre_hooks=False)
            _mark_clean()
            return out
        if cap.escaped or cap.settle:  # e.g. optimizer state created on this call: run it, trace again next time
            why = [f"{cap.escaped} new state tensor(s)"] if cap.escaped else []
            if cap.settle:
                why.append(f"{len(cap.settle)} input(s) on one device settled replicated over the mesh")
            analysis.event("trace", f"compile call ({reason}; {', '.join(why)}: not cached)",
                           hash(cap.struct), len(cap.leaves), len(cap.roots), site=self._name, force=True)
            executor.sync(pre_hooks=False)
            layouts.settle(cap.settle)
            _mark_clean()
            self._last_sig = sig
            return out
        del out
        compiled, fresh = _executable(cap)
        analysis.event("compile" if fresh else "trace", f"compile call ({reason})", hash(cap.struct),
                       len(cap.leaves), len(cap.roots), site=self._name, force=True, count=fresh)
        results = compiled(*replay.first_inputs(cap))
        metrics._COUNTS["executions"] += 1
        entry = replay.Entry(cap, compiled, list(results))
        if old is not None:
            entry.calls = old.calls
            if old.hyper_where == entry.hyper_where and old.hyper_values and entry.hyper_values:
                entry.hyper_checked = old.hyper_checked | {
                    i for i, (a, b) in enumerate(zip(old.hyper_values, entry.hyper_values)) if a != b}
            diff = replay.compare(old, cap)
            if diff is not None:
                entry.always_trace = True
                warnings.warn(GraphChangedWarning(
                    f"compile({self._name}): {diff}; earlier replays of this signature may have used a stale "
                    f"graph. Remove data-dependent Python from the function; it is now traced on every call"),
                    stacklevel=3)
            elif old.always_trace:
                entry.always_trace = True
        self._entries.pop(sig, None)
        self._entries[sig] = entry  # NOTE: insertion order is recency (a replay moves its entry last)
        if len(self._entries) > config.compile_cache_size:
            self._evict(reason)
        self._last_sig = sig
        res = entry.apply(results, flat, unpad=False)
        for hook in executor.POST_SYNC:  # uneven storages: the sticky hook unpads what it padded at capture
            hook([])
        _mark_clean()
        return res

    def _evict(self, reason: str) -> None:
        """Drop the least recently used signature's program; warn the first time."""
        del self._entries[next(iter(self._entries))]
        self._evicted += 1
        if self._evicted == 1:
            warnings.warn(RetraceWarning(
                f"compile({self._name}) keeps tracing new signatures: more than config.compile_cache_size="
                f"{config.compile_cache_size} programs, the least recently used are dropped (last: {reason}). "
                f"Pass values that change every call as tensors"), stacklevel=4)

    def clear(self) -> None:
        """Forget every traced signature."""
        self._entries.clear()
        self._lazy.clear()
        self._unshared.clear()
        self._last_sig = None


def _watched(fn: Callable[..., Any], rec: hyper.Recorder) -> Callable[..., Any]:
    """``fn`` under :class:`xla_dtensor.jit.hyper.Watch`."""
    def run(*args: Any, **kwargs: Any) -> Any:
        with hyper.Watch(rec):
            return fn(*args, **kwargs)
    return run


def _hyper_sources(cap: Any, rec: hyper.Recorder, where: list, vals: tuple | None) -> None:
    """The scalar leaves computed from hyperparameters become ``("hyper", expr)`` inputs."""
    if vals is None:
        return
    for i, n in enumerate(cap.leaves):
        e = rec.params.get(id(n))
        if e is not None and cap.sources[i][0] == "const":
            cap.sources[i] = ("hyper", e)
    cap.hyper, cap.hyper_values, cap.hyper_guards = where, vals, rec.guards


def _executable(cap: Any) -> tuple[Any, bool]:
    baked = replay.baked_constants(cap)
    dyn = replay.arg_order(cap)
    pos = {i: j for j, i in enumerate(dyn)}
    donate = tuple(sorted(pos[i] for i in cap.donate))
    key = (cap.struct, tuple(cap.outs), tuple(dyn), donate, tuple((i, type(v), v) for i, v in baked.items()))
    compiled = executor.lookup(key)
    if compiled is not None:
        return compiled, False
    run = executor.make_program(cap.fns, cap.wiring, cap.shardings, cap.outs)
    n = len(cap.leaves)

    def program(*values: Any) -> tuple:
        full: list[Any] = [None] * n
        for i, v in baked.items():
            full[i] = v
        for j, i in enumerate(dyn):
            full[i] = values[j]
        return run(*full)
    t0 = time.perf_counter()
    compiled = jax.jit(program, donate_argnums=donate).lower(*replay.first_inputs(cap)).compile()
    timing.record("compile", time.perf_counter() - t0)
    executor.store(key, compiled)
    return compiled, True


def compile(fn: Callable[..., Any] | None = None) -> Any:  # noqa: A001 - the public name
    """Trace ``fn`` once per input signature and replay its executable afterwards.

    Covers reads and in-place writes of module parameters, gradients and optimizer
    state reached from the arguments, under any sharding (layouts are fixed when a call is
    traced). Outputs are new tensors (no autograd history).

    The trace-once contract: a replay runs no Python, so ``fn``'s graph must follow from
    its signature: the arguments' shapes, dtypes and Python values, and the Python scalars
    and small containers ``fn`` itself reads from its globals and closure (watched on every
    call). Host reads while tracing make it run lazily (``DataDependentWarning``); other
    hidden state (attributes, globals read by the functions it calls) is caught by the
    re-trace every ``config.compile_check_every`` replays (``GraphChangedWarning``).

    Example:
        >>> import torch, xla_dtensor
        >>> @xla_dtensor.compile
        ... def step(x, w):
        ...     w.add_(x)
        ...     return (w * 2).sum()
        >>> w = torch.zeros(3, device=xla_dtensor.device())
        >>> [step(torch.ones(3, device=xla_dtensor.device()), w).item() for _ in range(3)]
        [6.0, 12.0, 18.0]
    """
    if fn is None:
        return compile
    if not callable(fn):
        raise TypeError(f"compile() expects a callable, got {type(fn).__name__}: {fn!r}")
    return CompiledFunction(fn)


del LazyTensor
