"""What a recorder with no Python in its per-op path would cost: the lazy core against a C++ probe, both under
torch's dispatcher, autograd and nn.Module, next to torch eager on one CPU thread.

The lazy core records each op through a C++ kernel at torch's Python key into C code that builds Python
objects (node, tensor, storage). Would a recorder written wholly in C++ below torch's dispatcher (the design
issue 40's per-op target points at) cost less? ``benchmarks/recorder_probe.cpp`` is such a recorder, built
for this measurement only: one boxed C++ kernel at the PrivateUse1 key takes every op, finds its cached plan
(output metadata, from one run on meta tensors per signature), makes one hash-consed C++ node and C++ output
tensors, and never computes anything. Its tensors are not Python objects unless they reach Python.

The model is ``lazy_overhead``'s 12-layer, width-64 GPT (sequence 32, batch 2); forward and backward only
(the optimizer and ``sync()`` are left out: the probe has neither). Each case runs in its own process with
``torch.set_num_threads(1)`` and the backward on the calling thread; after 3 warm-up steps the processes
step in turn, one step each a round, ``--steps`` rounds (the machine's speed drifts over minutes: adjacent
steps compare, runs minutes apart do not). The table gives each case's median calling-thread CPU ms and the
median over rounds of its step / torch eager's:

* ``torch``: torch eager on its CPU kernels (the compute included: small at this size).
* ``lazy``: the lazy core recording; between steps, outside the clock, the gradients go and ``sync()`` and
  ``wait()`` run with nothing alive to compute (the hash-cons table goes, so each step records anew).
* ``probe``: the C++ probe recording (its hash-cons table dropped between steps).
* ``probe floor``: the probe making its output tensors from its plans but no node: torch's dispatcher,
  autograd and nn.Module around a backend that does nothing else.

Ops per step: the lazy core's recorded ops (``metrics ops_recorded``); the probe's nodes (index nodes of
multi-output ops included, as the core counts its ``getitem`` nodes). The probe records torch's decomposed
ops (``F.linear`` as ``t`` and ``addmm``, attention in ~10 ops), the core its fused ``linear`` and attention
routes, so per-op figures differ in what an op is; the step's time is the comparison. Single ops (a view of a
tensor that requires grad, an add of two, a ``detach``): the fastest of 7 loops of 5,000 calls.

Usage: PYTHONPATH=. python benchmarks/recorder_probe.py [--steps 30] [--no-save]

Writes ``benchmarks/results/recorder_probe.md`` and ``recorder_probe.png``. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results"
SOURCE = ROOT / "recorder_probe.cpp"
CASES = ("torch", "lazy", "probe", "probe_floor")
LABELS = {"torch": "torch eager (CPU)", "lazy": "lazy core", "probe": "C++ probe", "probe_floor": "probe floor"}


def _probe_path() -> Path:
    from xla_dtensor.core import cxx
    return cxx.build_dir() / f"_recorder_probe{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def build() -> Path:
    """Compile the probe (in the parent process: its children must not import ``xla_dtensor``, which takes
    the PrivateUse1 backend); its path."""
    from xla_dtensor.core import cxx
    out = _probe_path()
    if out.exists() and out.stat().st_mtime >= SOURCE.stat().st_mtime:
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"compiling {SOURCE.name} (~25 s)", file=sys.stderr, flush=True)
    cxx.compile_to(out, SOURCE)
    return out


def _load(name: str, path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _load_probe(path: Path, cxx_path: Path) -> Any:
    """The probe's module, with PrivateUse1 named ``probe``, the lazy core's C++ device guard (its ``_cxx`` module
    loaded alone: importing ``xla_dtensor`` would take PrivateUse1) and a device module for torch's Python side."""
    import torch
    if not _load("xla_dtensor.core._cxx", cxx_path).register_device_guard():
        raise RuntimeError("PrivateUse1 has a device guard already: the probe needs a process of its own")
    torch.utils.rename_privateuse1_backend("probe")
    dev = types.ModuleType("probe")
    for name, fn in {"is_available": lambda: True, "device_count": lambda: 1, "current_device": lambda: 0,
                     "is_initialized": lambda: True, "_is_in_bad_fork": lambda: False,
                     "manual_seed_all": lambda seed: None}.items():
        setattr(dev, name, fn)
    torch._register_device_module("probe", dev)
    return _load("_recorder_probe", path)


def _serve(model: Any, batch: tuple, after: Callable[[], None], count: Callable[[], int], dev: Any,
           reset: Callable[[], None]) -> None:
    """A case process: the single ops (:func:`_single_ops`, before any step: after a lazy step they measured up
    to 2x slower until a ``gc.collect()``), 3 warm-up steps, then one forward and backward per ``step`` line
    (:func:`_in_turn.serve`), its calling-thread CPU ms and ops (``count``) on a line; ``after()`` outside the
    clock. Any other line: the single ops' figures on a last line."""
    import torch

    from benchmarks._in_turn import serve

    def step() -> dict:
        n0 = count()
        with torch.autograd.set_multithreading_enabled(False):  # the backward on this thread
            c0 = time.thread_time()
            loss = model(*batch)
            c1 = time.thread_time()
            loss.backward()
            c2 = time.thread_time()
        ops = count() - n0
        del loss
        after()
        return {"forward_ms": 1e3 * (c1 - c0), "backward_ms": 1e3 * (c2 - c1), "ops": ops}

    single = _single_ops(dev, reset)
    for _ in range(3):
        step()
    serve(step)
    print(json.dumps(single), flush=True)


def _single_ops(dev: Any, reset: Callable[[], None], n: int = 5000, reps: int = 7) -> dict:
    """Calling-thread CPU us of one view (with grad), add (with grad) and detach: the fastest of ``reps`` loops of
    ``n`` calls, after one loop untimed."""
    import torch
    x = torch.randn(2, 32, 64).to(dev).requires_grad_(True)
    calls = {"view": lambda: x.view(64, 64), "add": lambda: x + x, "detach": lambda: x.detach()}
    out = {}
    for name, f in calls.items():
        best = float("inf")
        for _ in range(n):  # one loop untimed: first calls find their plans
            f()
        reset()
        for _ in range(reps):
            c0 = time.thread_time()
            for _ in range(n):
                f()
            best = min(best, time.thread_time() - c0)
            reset()
        out[name] = 1e6 * best / n
    return out


def case_torch(args: argparse.Namespace) -> None:
    import torch
    from benchmarks.lazy_overhead import _setup
    torch.set_num_threads(1)
    model, opt, batch = _setup(torch.device("cpu"), "adamw")
    _serve(model, batch, lambda: opt.zero_grad(set_to_none=True), lambda: 0, "cpu", lambda: None)


def case_lazy(args: argparse.Namespace) -> None:
    import torch
    torch.set_num_threads(1)
    import xla_dtensor
    from benchmarks.lazy_overhead import _setup
    from xla_dtensor import metrics
    model, opt, batch = _setup(xla_dtensor.device(), "adamw")

    def after() -> None:  # nothing alive to compute; the step's hash-cons table goes (else the next,
        opt.zero_grad(set_to_none=True)  # identical step would find every node made already)
        xla_dtensor.sync()
        xla_dtensor.wait()

    _serve(model, batch, after, lambda: metrics.counters()["ops_recorded"], xla_dtensor.device(), xla_dtensor.sync)


def case_probe(args: argparse.Namespace, nodes: bool = True) -> None:
    import torch
    probe = _load_probe(Path(args.probe), Path(args.cxx))
    probe.set_nodes(nodes)
    from benchmarks.lazy_overhead import _setup
    torch.set_num_threads(1)
    model, opt, batch = _setup(torch.device("probe"), "adamw")
    loss = model(*batch)
    with torch.autograd.set_multithreading_enabled(False):
        loss.backward()
    made = [p.grad is not None and p.grad.shape == p.shape for p in model.parameters()]
    if not all(made):
        raise RuntimeError(f"the probe's backward left {made.count(False)} of {len(made)} gradients unmade")
    del loss

    def after() -> None:
        opt.zero_grad(set_to_none=True)
        probe.reset()

    _serve(model, batch, after, lambda: probe.counts()[0], "probe", probe.reset)


def _start(case: str, probe: Path, core_cxx: Path) -> Any:
    cmd = [sys.executable, __file__, "--case", case, "--probe", str(probe), "--cxx", str(core_cxx)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    if proc.stdout.readline().strip() != "ready":
        proc.wait()
        raise RuntimeError(f"the {case} case failed to start (exit {proc.returncode})")
    return proc


def _in_turn(args: argparse.Namespace) -> dict[str, dict]:
    """The cases in their own processes, one step each in turn, ``--steps`` rounds after 3 warm-up rounds: each
    one's medians, the median over rounds of its step / torch eager's, and its single ops."""
    from benchmarks._in_turn import step_in_turn
    from xla_dtensor.core import cxx
    probe, core_cxx = build(), cxx.build()
    procs = {c: _start(c, probe, core_cxx) for c in CASES}
    try:
        steps = step_in_turn(procs, args.steps, progress=True)
        single = {}
        for c, proc in procs.items():
            proc.stdin.write("end\n")
            proc.stdin.flush()
            single[c] = json.loads(proc.stdout.readline())
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()
    total = lambda x: x["forward_ms"] + x["backward_ms"]  # noqa: E731
    out = {}
    for c in CASES:
        med = {k: statistics.median(s[k] for s in steps[c]) for k in ("forward_ms", "backward_ms", "ops")}
        ms = statistics.median(total(s) for s in steps[c])
        out[c] = {**med, "ms": ms, "single_us": single[c],
                  "vs_torch": statistics.median(total(a) / total(b) for a, b in zip(steps[c], steps["torch"])),
                  "us_per_op": 1e3 * ms / med["ops"] if med["ops"] else None}
    return out


def table(rows: dict[str, dict]) -> str:
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    lines = ["| case | forward + backward ms | vs torch eager | forward ms | backward ms | ops a step | us / op "
             "| view us | add us | detach us |", "|---|---|---|---|---|---|---|---|---|---|"]
    for c, x in rows.items():
        s = x["single_us"]
        lines.append(f"| {LABELS[c]} | {x['ms']:.2f} | {x['vs_torch']:.2f}x | {x['forward_ms']:.2f} | "
                     f"{x['backward_ms']:.2f} | {fmt(x['ops'] or None, '.0f')} | {fmt(x['us_per_op'], '.1f')} | "
                     f"{s['view']:.2f} | {s['add']:.2f} | {s['detach']:.2f} |")
    return "\n".join(lines)


HEAD = "# Recorder probe: the lazy core against a C++ recorder under torch's dispatcher\n\n"


def _save(rows: dict[str, dict], text: str) -> None:
    """The table as the file's ``measured`` section (other sections, a summary written by hand, kept) and the plot."""
    from benchmarks._in_turn import save_section
    from benchmarks._plots import paired_bars
    save_section(RESULTS / "recorder_probe.md", HEAD, "measured", text)
    labels = [LABELS[c] for c in rows]
    paired_bars(RESULTS / "recorder_probe.png", labels, [rows[c]["forward_ms"] for c in rows],
                [rows[c]["backward_ms"] for c in rows], ("forward", "backward"), "calling thread CPU ms",
                "12-layer GPT, forward + backward recording (one CPU thread)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=CASES)
    p.add_argument("--steps", type=int, default=30, help="rounds in turn, one step of each case a round")
    p.add_argument("--probe", help=argparse.SUPPRESS)
    p.add_argument("--cxx", help=argparse.SUPPRESS)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args()
    if args.case:
        {"torch": case_torch, "lazy": case_lazy, "probe": case_probe,
         "probe_floor": lambda a: case_probe(a, nodes=False)}[args.case](args)
        return
    rows = _in_turn(args)
    text = (f"## Measured\n\nEach case in its own process, one step each in turn, medians of {args.steps} rounds after 3 warm-up "
            f"rounds (`python benchmarks/recorder_probe.py`); vs torch eager: the median over rounds of the "
            f"step's ratio.\n\n{table(rows)}\n")
    print(HEAD + text)
    if not args.no_save:
        _save(rows, text)


if __name__ == "__main__":
    main()
