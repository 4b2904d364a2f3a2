"""Probe: wrong results when two Python threads train on the device at once (issue 23).

Runs the jobs of ``tests/xla_dtensor/core/test_threads.py`` many times: two threads, each
training its own MLP, in the 6 mode pairs (lazy, ``compile``, eager), under three
schedules (``aligned``: a barrier lines the threads' phases up; ``staggered``: thread B one
phase behind A; ``free``: no barrier), plus the sharded pair (DP 1x8 lazy + 2x4 Megatron
``compile``) and the out-of-range index orders. A thread's result is wrong when it raised,
or when its losses are not torch CPU's (rtol 1e-4); the index jobs: when thread A did not
get its ``IndexError``, or thread B got one or values other than CPU's. Results that are
right but not bit-equal to the same job run alone are counted apart (a ``compile`` trace
syncs every thread, so it may split a lazy thread's step into two programs, fused
differently). A correctness count, not a speed claim. Prints a table; saves
``benchmarks/results/thread_probe.md``.

Usage: PYTHONPATH=. python benchmarks/thread_probe.py [--reps 5]
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import mesh  # noqa: F401,I001  (8 virtual devices: before jax)
import torch

import xla_dtensor
from tests.xla_dtensor.core import test_threads as T
from xla_dtensor.core import index_checks
from xla_dtensor.debug.analysis import RecompileWarning

RESULTS = Path(__file__).resolve().parent / "results"


def _free(modes: tuple[str, str]) -> list[Callable[[threading.Barrier], Any]]:
    a, b = T._model(T.SEEDS[0]), T._model(T.SEEDS[1])  # (on this thread: they seed torch's generator)
    return [lambda bar: T.train(modes[0], T.SEEDS[0], model=a), lambda bar: T.train(modes[1], T.SEEDS[1], model=b)]


def _wrong_training(jobs: list, modes: tuple[str, str], ref: dict, alone: dict | None) -> tuple[int, int, str]:
    """(wrong thread results of one run, results not bit-equal to the job alone, the first failure's text)."""
    try:
        got = T.run_threads(jobs)
    except Exception as e:  # noqa: BLE001  (counted)
        return len(jobs), 0, f"{type(e).__name__}: {str(e)[:120]}"
    wrong, inexact, why = 0, 0, ""
    for mode, seed, losses in zip(modes, T.SEEDS, got):
        if not torch.allclose(torch.tensor(losses), torch.tensor(ref[seed]), rtol=1e-4, atol=0):
            wrong, why = wrong + 1, why or f"{mode} seed {seed}: {losses} vs CPU {ref[seed]}"
        elif alone is not None and losses != alone[mode, seed]:
            rel = max(abs(a - b) / abs(b) for a, b in zip(losses, alone[mode, seed]))
            inexact, why = inexact + 1, why or f"({mode} seed {seed}: {rel:.1e} from alone)"
    return wrong, inexact, why


def _wrong_index(order: str) -> tuple[int, str]:
    """(wrong thread results of one index-check run: 0-2, the failure's text)."""
    old = xla_dtensor.config.check_indices
    xla_dtensor.config.check_indices = True
    try:
        T.test_index_error_is_raised_in_the_thread_that_made_it(None, order)  # (its fixture: set above)
        return 0, ""
    except Exception as e:  # noqa: BLE001  (counted: the test's assertions name the thread that was wrong)
        return 1, f"{type(e).__name__}: {str(e)[:120]}"
    finally:
        xla_dtensor.config.check_indices = old
        index_checks.PENDING.clear()
        index_checks.LAUNCHED.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=RecompileWarning)  # every run's new models retrace compile
    sys.setswitchinterval(1e-5)  # as the test: the threads' ops interleave finely
    t0 = time.perf_counter()
    ref = {s: T.cpu_losses(s) for s in T.SEEDS}
    alone = {(m, s): T.train(m, s) for m in T.MODES for s in T.SEEDS}
    rows: list[tuple[str, str, int, int, int, str]] = []  # (case, schedule, results, wrong, not bit-equal, first note)
    for modes in T.PAIRS:
        for schedule in ("aligned", "staggered", "free"):
            n = wrong = inexact = 0
            why = ""
            for _ in range(a.reps):
                jobs = _free(modes) if schedule == "free" else T._pair(modes, schedule == "staggered")
                w, x, text = _wrong_training(jobs, modes, ref, alone)
                n, wrong, inexact, why = n + 2, wrong + w, inexact + x, why or text
            rows.append(("+".join(modes), schedule, n, wrong, inexact, why))
    n = wrong = 0
    why = ""
    for _ in range(a.reps):
        jobs = T._pair(("lazy", "compile"), True, (T._dp, T._tp))
        w, _, text = _wrong_training(jobs, ("lazy", "compile"), ref, None)
        n, wrong, why = n + 2, wrong + w, why or text
    rows.append(("DP lazy + TP compile", "staggered", n, wrong, 0, why))
    for order in T.ORDERS:
        n = wrong = 0
        why = ""
        for _ in range(a.reps):
            w, text = _wrong_index(order)
            n, wrong, why = n + 2, wrong + w, why or text
        rows.append((f"index check: {order}", "aligned", n, wrong, 0, why))
    total, bad, inexact = sum(r[2] for r in rows), sum(r[3] for r in rows), sum(r[4] for r in rows)
    lines = [f"Two threads on the device, {a.reps} runs per case (`benchmarks/thread_probe.py`, "
             f"{time.perf_counter() - t0:.0f} s). Wrong thread results: {bad} of {total}; right (CPU's, rtol 1e-4) "
             f"but not bit-equal to the job run alone: {inexact} (the sharded pair is compared with CPU only).",
             "", "| case | schedule | thread results | wrong | not bit-equal to alone "
             "| first failure (or difference) |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {c} | {s} | {n} | {w} | {x} | {why} |" for c, s, n, w, x, why in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "thread_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
