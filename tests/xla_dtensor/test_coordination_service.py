"""The coordination service's helper process: a clear error when it cannot start, and no process left behind."""
from __future__ import annotations

import socket
import time

import pytest

from xla_dtensor import coordination_service as cs


def _state(pid: int) -> str:
    """'R'/'S'/... while running, 'Z' or 'gone' once it has exited."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "gone"


def _wait_ended(pid: int, seconds: float) -> float | None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        if _state(pid) in ("Z", "X", "gone"):
            return time.monotonic() - t0
        time.sleep(0.05)
    return None


def test_a_taken_port_is_a_clear_error_naming_the_address():
    with socket.socket(socket.AF_INET6) as taken:
        taken.bind(("::", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(cs.ServiceStartError, match=rf"did not start on \[::\]:{port}: error .*RPC server"):
            cs.start(f"[::]:{port}", 2, heartbeat_timeout=4, shutdown_timeout=5, init_timeout=30)


def test_the_helper_ends_when_every_process_has_left_and_not_before():
    handle = cs.start("[::]:0", 2, heartbeat_timeout=4, shutdown_timeout=5, init_timeout=30)
    first = socket.create_connection(("127.0.0.1", handle.presence_port))
    second = socket.create_connection(("127.0.0.1", handle.presence_port))
    first.close()  # one of two processes gone: the service must stay for the other
    assert _wait_ended(handle.pid, 1.5) is None, "helper ended while a process was still attending"
    second.close()
    took = _wait_ended(handle.pid, 10.0)  # init_timeout 30 s: ending now is the presence rule, not the timeout
    assert took is not None and took < 5.0, (took, _state(handle.pid))
