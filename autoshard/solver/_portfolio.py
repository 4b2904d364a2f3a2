"""Independent anytime searches in worker processes (one per extra core).

A :class:`Portfolio` starts ``python -m autoshard.solver._portfolio`` once per seed, sends each
the compact problem, its start plan and a time limit (pickled, on stdin) and reads back
what the worker finds: a frame per improvement or bound, (objective, plan, bound). The
caller's better plans go the other way (:meth:`Portfolio.share`, frames on the worker's
stdin), and a worker continues its run from one that beats it. The caller takes the best
plan and the highest bound (each is a valid bound of the same problem). Subprocesses,
not ``multiprocessing``: a spawned child would re-import the caller's ``__main__``.

Example::

    pf = Portfolio(compact, x0, 60.0, seeds=[1])   # one more search beside this process's,
    ...                                        # the caller's own search
    obj, x, bound = pf.best()                  # (inf, None, -inf) until a worker reports
    pf.close(wait=5.0)
"""
from __future__ import annotations

import math
import os
import pickle
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

__all__ = ["Portfolio"]

_HEADER = struct.Struct("<Q")


def _write(stream, obj) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_HEADER.pack(len(data)) + data)
    stream.flush()


def _read(stream):
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    return None if len(data) < size else pickle.loads(data)


class Portfolio:
    """Worker searches on ``compact`` from ``x0`` with the given seeds, each ending by
    ``time_limit`` seconds from now (wall clock; the workers' start-up counts)."""

    def __init__(self, compact, x0: np.ndarray, time_limit: float, seeds: list[int],
                 nice: int = 0) -> None:
        deadline = time.time() + time_limit
        self._lock = threading.Lock()
        self._best: tuple[float, np.ndarray | None, float] = (math.inf, None, -math.inf)
        self.errors: list[str] = []   # workers that failed (their last stderr line)
        self._stopping: set[int] = set()  # pids of the workers close() stopped
        root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([root] + [p for p in sys.path if p]))
        self._procs = []
        self._threads = []
        problem = pickle.dumps((compact, x0, deadline), protocol=pickle.HIGHEST_PROTOCOL)  # once for all
        for seed in seeds:
            proc = subprocess.Popen([sys.executable, "-m", "autoshard.solver._portfolio"], env=env,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE)
            _write(proc.stdin, (problem, seed, nice))
            th = threading.Thread(target=self._listen, args=(proc,), daemon=True)
            th.start()
            self._procs.append(proc)
            self._threads.append(th)

    def _listen(self, proc: subprocess.Popen) -> None:
        while (msg := _read(proc.stdout)) is not None:
            obj, x, bound = msg
            with self._lock:
                b_obj, b_x, b_bound = self._best
                if obj < b_obj:
                    b_obj, b_x = obj, x
                self._best = (b_obj, b_x, max(b_bound, bound))
        err = proc.stderr.read().decode(errors="replace").strip()
        if proc.wait() != 0 and proc.pid not in self._stopping:
            self.errors.append(err.splitlines()[-1] if err else f"exit status {proc.returncode}")

    def share(self, obj: float, x: np.ndarray, bound: float) -> None:
        """Send the plan ``x`` (objective ``obj``) and the caller's ``bound`` to every
        worker still running."""
        for proc in self._procs:
            try:
                _write(proc.stdin, (obj, x, bound))
            except (OSError, ValueError):  # the worker has finished (pipe broken or closed)
                pass

    def best(self) -> tuple[float, np.ndarray | None, float]:
        """(objective, plan, bound) of the best worker plan so far and the highest bound."""
        with self._lock:
            return self._best

    @property
    def killed(self) -> int:
        """Workers still running at :meth:`close`, stopped there."""
        return len(self._stopping)

    def close(self, wait: float) -> None:
        """Wait up to ``wait`` seconds for the workers' last reports, then stop them
        (counted in ``killed``, not in ``errors``)."""
        end = time.perf_counter() + max(wait, 0.0)
        for th in self._threads:
            th.join(max(end - time.perf_counter(), 0.0))
        for proc in self._procs:
            try:
                proc.stdin.close()
            except OSError:  # a broken pipe: the worker has gone
                pass
            if proc.poll() is None:
                self._stopping.add(proc.pid)
                proc.kill()
                proc.wait()


def _main() -> None:
    from autoshard.solver._anytime import AnytimeSearch, AnytimeSettings

    problem, seed, nice = _read(sys.stdin.buffer)
    if nice > 0 and hasattr(os, "nice"):
        os.nice(nice)  # the caller's dual, not this search, makes the big steps (M)
    compact, start, deadline = pickle.loads(problem)
    out = sys.stdout.buffer
    latest: list = [None]

    def listen() -> None:  # the caller's better plans
        while (msg := _read(sys.stdin.buffer)) is not None:
            latest[0] = msg

    threading.Thread(target=listen, daemon=True).start()
    # workers search; the caller's process keeps the dual (and its kernels) going
    settings = AnytimeSettings(bound_share=0.05, hot_rate=math.inf, first_rate=math.inf)
    AnytimeSearch(compact, start, max(deadline - time.time(), 0.0), settings=settings, seed=seed,
                  report=lambda obj, x, bound: _write(out, (obj, x, bound)),
                  inbox=lambda: latest[0]).run()
    out.flush()
    os._exit(0)  # the stdin listener may still be blocked in a read


if __name__ == "__main__":
    _main()
