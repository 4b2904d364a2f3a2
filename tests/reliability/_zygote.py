"""A process that imports xla_dtensor once and forks test jobs (a fork starts in ~0.1 s, an import takes ~10 s).

JAX's backend is never started here, so each child starts its own (with its own
``XLA_FLAGS``, e.g. 4 devices for a 2-process job). Protocol: one JSON request per
line on stdin, one JSON reply per line on stdout::

    {"jobs": [{"fn": "save_loop", "args": {...}, "out": "log path", "env": {...}}],
     "kill": {"job": 0, "after_file": "path", "delay": 0.2} | null, "timeout": 60}
    -> {"results": [{"rc": 0, "signal": null, "timed_out": false, "seconds": 1.2}]}

A job is a function of ``_jobs``; its stdout/stderr go to ``out``; it ends like a normal
interpreter (atexit handlers run). ``kill`` sends SIGKILL to one job ``delay`` seconds
after ``after_file`` appears. A job still running at ``timeout`` is killed and reported.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
import traceback

import xla_dtensor  # noqa: F401  (imported once; forks inherit it)
import xla_dtensor.checkpoint  # noqa: F401

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _jobs  # noqa: E402


def _child(job: dict) -> None:
    fd = os.open(job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.environ.update(job.get("env", {}))
    code = 0
    try:
        getattr(_jobs, job["fn"])(**job.get("args", {}))
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run(spec: dict) -> dict:
    start = time.monotonic()
    pids = []
    for job in spec["jobs"]:
        pid = os.fork()
        if pid == 0:
            _child(job)
        pids.append(pid)
    status: dict[int, int] = {}
    kill = spec.get("kill")
    deadline = start + spec.get("timeout", 120)
    killed_at = None
    timed_out = set()
    while len(status) < len(pids):
        for i, pid in enumerate(pids):
            if i not in status:
                done, st = os.waitpid(pid, os.WNOHANG)
                if done:
                    status[i] = st
        if kill and killed_at is None and kill["job"] not in status and os.path.exists(kill["after_file"]):
            time.sleep(kill["delay"])
            os.kill(pids[kill["job"]], signal.SIGKILL)
            killed_at = time.monotonic()
        if time.monotonic() > deadline:
            for i, pid in enumerate(pids):
                if i not in status:
                    os.kill(pid, signal.SIGKILL)
                    timed_out.add(i)
            deadline = float("inf")
        time.sleep(0.005)
    return {"results": [{"rc": os.WEXITSTATUS(status[i]) if os.WIFEXITED(status[i]) else None,
                         "signal": os.WTERMSIG(status[i]) if os.WIFSIGNALED(status[i]) else None,
                         "timed_out": i in timed_out, "seconds": time.monotonic() - start}
                        for i in range(len(pids))]}


def main() -> None:
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)


if __name__ == "__main__":
    main()
