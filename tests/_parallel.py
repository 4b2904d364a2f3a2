"""Tests whose cases each wait on their own fresh process: run the processes two at a time, and early.

The pytest process only waits while a child runs, so on the 2-core machine the default run
uses two children at once to halve the wall time of such a module. Each case keeps its own
process and its own assertions; a case's error is raised in that case's test.

The test process itself is single-threaded, so the second core idles for most of the run. A
module whose fresh-process work needs nothing from the test process defines
``start_early(session)``; ``tests/conftest.py`` calls it when collection ends, and the module
hands that work to :func:`start_early`: one background lane runs such jobs in session order,
their children at :data:`NICE` (they take only the CPU the test process leaves). The module's
fixture then takes the job's result with :func:`early` (waiting for it if it is still running,
or running it then if the lane has not reached it). While the test process waits on a job, its children
go back to niceness 0 where the OS allows it (:func:`hurry`): on a machine loaded by other work they
would otherwise wait for idle CPU. Each background job gets its own ``XLA_DTENSOR_CACHE_DIR``
(:func:`child_env`), so no test's caches see its plans or programs.

Example:
    >>> from tests._parallel import Results
    >>> r = Results(lambda k: k * 2, ["a", "b"])
    >>> r["b"]
    'bb'
    >>> job = lambda: Results(lambda k: k * 2, ["c"])
    >>> start_early("doubled", job)
    >>> early("doubled", job)["c"]
    'cc'
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

WORKERS = 2
NICE = 10  # niceness of the children of background jobs: the test process (niceness 0) goes first


class Results:
    """``fn(key)`` for every key, :data:`WORKERS` at a time; ``results[key]`` returns it or raises its error."""

    def __init__(self, fn: Callable[[Any], Any], keys: Iterable[Any]) -> None:
        def call(key: Any) -> tuple[bool, Any]:
            try:
                return True, fn(key)
            except BaseException as err:  # noqa: BLE001 - raised again in the key's own test
                return False, err
        keys = list(keys)
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            self._done = dict(zip(keys, pool.map(call, keys)))

    def __getitem__(self, key: Any) -> Any:
        ok, value = self._done[key]
        if not ok:
            raise value
        return value


def selected(request: pytest.FixtureRequest, param: str) -> list[Any]:
    """The values of parameter ``param`` of this module's tests that the session will run, in order."""
    return selected_in(request.session, request.module, param)


def selected_in(session: pytest.Session, module: Any, param: str) -> list[Any]:
    """The values of parameter ``param`` of ``module``'s tests that ``session`` will run, in order."""
    out = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is module and param in params and params[param] not in out:
            out.append(params[param])
    return out


def claim(folder: str | Path, name: str) -> bool:
    """Whether the caller takes the item ``name`` from processes sharing ``folder``: it creates the
    item's claim file there first (exclusively)."""
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


# ---- children: niced, hurried when waited on, stopped when the session ends ----

_LIVE: dict[subprocess.Popen, int] = {}  # child -> the niceness it started at
_LOCK = threading.Lock()
_SCRATCH: list[str] = []  # folders made by scratch(), removed by stop()
_STOPPED: list[bool] = []  # set by stop(): no child starts after it
_URGENT: list[bool] = []  # set while the test process runs a job itself: its children start at niceness 0


def popen(cmd: list[str], nice: int = NICE, **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(cmd, **kwargs)`` at niceness ``nice`` (where ``nice(1)`` exists), hurried by
    :func:`hurry` and killed by :func:`stop`."""
    nice = 0 if _URGENT and nice == NICE else nice
    if nice and shutil.which("nice"):
        cmd = ["nice", "-n", str(nice), *cmd]
    with _LOCK:
        if _STOPPED:
            raise RuntimeError(f"the test session has ended; not starting {cmd}")
        proc = subprocess.Popen(cmd, **kwargs)
        _LIVE[proc] = nice
    return proc


def run(cmd: list[str], *, timeout: float, input: str | None = None, nice: int = NICE,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout, **kwargs)`` through
    :func:`popen`."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    proc = popen(cmd, nice, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    finally:
        with _LOCK:
            _LIVE.pop(proc, None)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def hurry(procs: Iterable[subprocess.Popen] | None = None) -> None:
    """``procs`` (None: every running child started at :data:`NICE`) back to niceness 0 where the OS allows it
    (root; elsewhere they keep theirs, and so do the processes they started before): the test process waits
    on them now, so on a machine loaded by other work they should not wait for idle CPU."""
    with _LOCK:
        procs = [p for p, n in _LIVE.items() if n == NICE] if procs is None else list(procs)
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(OSError, AttributeError):  # not permitted, gone, or no setpriority
                os.setpriority(os.PRIO_PROCESS, proc.pid, 0)


def scratch(prefix: str) -> Path:
    """A new temporary folder, removed by :func:`stop`."""
    path = tempfile.mkdtemp(prefix=f"xla_dtensor_{prefix}_")
    _SCRATCH.append(path)
    return Path(path)


def child_env(env: dict[str, str], name: str) -> dict[str, str]:
    """``env`` with a cache folder of the background job ``name``'s own (see the module doc)."""
    return dict(env, XLA_DTENSOR_CACHE_DIR=str(scratch(f"{name.rsplit('.', 1)[-1]}_cache")))


# ---- the background lane ----

class _Job:
    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.state, self.done = fn, "queued", threading.Event()
        self.ok, self.value = False, None


_JOBS: dict[str, _Job] = {}
_QUEUE: list[str] = []
_LANE: list[threading.Thread] = []


def start_early(name: str, fn: Callable[[], Any]) -> None:
    """Queue ``fn()`` as background job ``name`` (one at a time, in the order queued); see :func:`early`."""
    with _LOCK:
        _JOBS[name] = _Job(fn)
        _QUEUE.append(name)
        if not _LANE:
            _LANE.append(threading.Thread(target=_lane, name="tests-early", daemon=True))
            _LANE[0].start()


def early(name: str, fn: Callable[[], Any]) -> Any:
    """The result of background job ``name`` (its error raised here); ``fn()`` now if it was not queued
    or the lane has not started it."""
    with _LOCK:
        job = _JOBS.pop(name, None)
        if job is not None and job.state == "queued":
            job.state = "taken"
            job = None
    if job is None:
        _URGENT.append(True)
        try:
            return fn()
        finally:
            _URGENT.pop()
    while not job.done.wait(1.0):
        hurry()
    if not job.ok:
        raise job.value
    return job.value


def cancel(name: str) -> bool:
    """Drop background job ``name`` if the lane has not started it: whether it was dropped (it then never runs,
    and :func:`early` would run it in the caller)."""
    with _LOCK:
        job = _JOBS.get(name)
        if job is None or job.state != "queued":
            return False
        del _JOBS[name]
        job.state = "taken"
    return True


def finished(name: str) -> bool:
    """Whether background job ``name`` has ended (or is not on the lane: :func:`early` took or dropped it)."""
    with _LOCK:
        job = _JOBS.get(name)
    return job is None or job.done.is_set()


def _lane() -> None:
    while True:
        with _LOCK:
            if not _QUEUE:
                _LANE.clear()
                return
            job = _JOBS.get(_QUEUE.pop(0))
            if job is None or job.state != "queued":
                continue
            job.state = "running"
        try:
            job.value, job.ok = job.fn(), True
        except BaseException as err:  # noqa: BLE001 - raised again by early()
            job.value = err
        job.done.set()


def stop() -> None:
    """Drop the queued jobs, kill every child still running, remove the scratch folders (session end)."""
    with _LOCK:
        _STOPPED.append(True)
        _QUEUE.clear()
        procs = list(_LIVE)
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for path in _SCRATCH:
        shutil.rmtree(path, ignore_errors=True)
    _SCRATCH.clear()
