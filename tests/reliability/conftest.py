"""Fault-injection suite: one pre-imported zygote process forks every job (see _zygote.py).

``XLA_DTENSOR_SOAK=N`` runs N kill-during-save trials instead of the default dozen
(a longer soak; see docs/spmd.md).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from typing import Any

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class Zygote:
    """The pytest side of ``_zygote.py``: ``run(jobs, kill=None, timeout=60)`` -> per-job results."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
        self.proc = subprocess.Popen([sys.executable, os.path.join(HERE, "_zygote.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        assert json.loads(self.proc.stdout.readline())["ready"]

    def run(self, jobs: list[dict[str, Any]], kill: dict[str, Any] | None = None, timeout: float = 60) -> list[dict]:
        self.proc.stdin.write(json.dumps({"jobs": jobs, "kill": kill, "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["results"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.kill()  # NOTE: idle between requests; nothing to flush
        self.proc.wait()


@pytest.fixture(scope="session")
def zygote():
    z = Zygote()
    yield z
    z.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def results(path: str) -> list[str]:
    """The ``RESULT`` lines a job printed."""
    with open(path, errors="replace") as f:
        return [line[len("RESULT "):].strip() for line in f if line.startswith("RESULT ")]


FOUR_DEVICES = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "XLA_DTENSOR_CPU_DEVICES": "4"}
