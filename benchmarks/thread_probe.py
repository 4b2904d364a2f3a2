"""Probe: wrong results when two Python threads train on the device at once (issue 23).

Runs the jobs of ``tests/xla_dtensor/core/test_threads.py`` many times: two threads, each
training its own MLP, in the 6 mode pairs (lazy, ``compile``, eager), under three
schedules (``aligned``: a barrier lines the threads' phases up; ``staggered``: thread B one
phase behind A; ``free``: no barrier), plus the sharded pair (DP 1x8 lazy + 2x4 Megatron
``compile``) and the out-of-range index orders. A thread's result is wrong when it raised,
when its losses are not torch CPU's (rtol 1e-4) or not bit-equal to the same job run alone
(the index jobs: when thread A did not get its ``IndexError``, or thread B got one or
values other than CPU's). A correctness count, not a speed claim. Prints a table; saves
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
from xla_dtensor.debug.analysis import RecompileWarning

RESULTS = Path(__file__).resolve().parent / "results"


def _free(modes: tuple[str, str]) -> list[Callable[[threading.Barrier], Any]]:
    return [lambda bar: T.train(modes[0], T.SEEDS[0]), lambda bar: T.train(modes[1], T.SEEDS[1])]


def _wrong_training(jobs: list, modes: tuple[str, str], ref: dict, alone: dict | None) -> tuple[int, str]:
    """(wrong thread results of one run, the first failure's text)."""
    try:
        got = T.run_threads(jobs)
    except Exception as e:  # noqa: BLE001  (counted)
        return len(jobs), f"{type(e).__name__}: {str(e)[:120]}"
    wrong, why = 0, ""
    for mode, seed, losses in zip(modes, T.SEEDS, got):
        ok = torch.allclose(torch.tensor(losses), torch.tensor(ref[seed]), rtol=1e-4, atol=0)
        if ok and alone is not None:
            ok = losses == alone[mode, seed]
        if not ok:
            wrong, why = wrong + 1, why or f"{mode} seed {seed}: {losses} vs CPU {ref[seed]}"
    return wrong, why


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
        T.index_checks.PENDING.clear()
        T.index_checks.LAUNCHED.clear()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    warnings.filterwarnings("ignore", category=RecompileWarning)  # every run's new models retrace compile
    sys.setswitchinterval(1e-5)  # as the test: the threads' ops interleave finely
    t0 = time.perf_counter()
    ref = {s: T.cpu_losses(s) for s in T.SEEDS}
    alone = {(m, s): T.train(m, s) for m in T.MODES for s in T.SEEDS}
    rows: list[tuple[str, str, int, int, str]] = []  # (case, schedule, results, wrong, first failure)
    for modes in T.PAIRS:
        for schedule in ("aligned", "staggered", "free"):
            n = wrong = 0
            why = ""
            for _ in range(a.reps):
                jobs = _free(modes) if schedule == "free" else T._pair(modes, schedule == "staggered")
                w, text = _wrong_training(jobs, modes, ref, alone)
                n, wrong, why = n + 2, wrong + w, why or text
            rows.append(("+".join(modes), schedule, n, wrong, why))
    n = wrong = 0
    why = ""
    for _ in range(a.reps):
        jobs = [*T._pair(("lazy", "compile"), True, T._dp)[:1], *T._pair(("lazy", "compile"), True, T._tp)[1:]]
        w, text = _wrong_training(jobs, ("lazy", "compile"), ref, None)
        n, wrong, why = n + 2, wrong + w, why or text
    rows.append(("DP lazy + TP compile", "staggered", n, wrong, why))
    for order in T.ORDERS:
        n = wrong = 0
        why = ""
        for _ in range(a.reps):
            w, text = _wrong_index(order)
            n, wrong, why = n + 2, wrong + w, why or text
        rows.append((f"index check: {order}", "aligned", n, wrong, why))
    total, bad = sum(r[2] for r in rows), sum(r[3] for r in rows)
    lines = [f"Two threads on the device, {a.reps} runs per case (`benchmarks/thread_probe.py`, "
             f"{time.perf_counter() - t0:.0f} s). Wrong thread results: {bad} of {total}.", "",
             "| case | schedule | thread results | wrong | first failure |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {s} | {n} | {w} | {why} |" for c, s, n, w, why in rows]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "thread_probe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
