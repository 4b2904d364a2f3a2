"""JAX's coordination service in a helper process, so that process 0 can die like any other.

``jax.distributed.initialize`` starts the job's coordination service inside process 0.
When process 0 dies, every other client's error poller sees the service's socket close
and jaxlib aborts that process in C++ (SIGABRT) before any Python runs; jax 0.10.2 has
no way to replace that handler from Python (a Python ``missed_heartbeat_callback`` ends
in ``std::bad_cast``). So :func:`start` (called by process 0) runs the service in a small
helper process of its own, started from this file as a script (stdlib and jaxlib only,
no torch): the death of process 0 is then a missing heartbeat, which
:mod:`xla_dtensor.runtime_dist`'s watchdog turns into a ``PeerFailureError`` as for any
other process.

The helper lives as long as the job: every process keeps a *presence* connection to it
(:func:`attend`; the kernel closes it when the process ends, however it ends), and the
helper stops once every process has closed it. It also stops when no process connects
within the join timeout, or when the job's processes are gone and none of the missing
ones has connected within the join timeout after the last one left.

Example:
    >>> handle = start("[::]:12345", 2, heartbeat_timeout=10, shutdown_timeout=300,
    ...                init_timeout=60)  # doctest: +SKIP
    >>> attend(("127.0.0.1", handle.presence_port), 0)  # doctest: +SKIP
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

_READY_WAIT = 60.0  # seconds for the helper to import jaxlib and bind the service's port
_PRESENCE: list[socket.socket] = []  # this process's presence connections, open until it ends
# NOTE: neither the working directory nor this file's folder on sys.path (xla_dtensor/random.py is not the stdlib's)
_BOOT = "import sys; del sys.path[0]; import runpy; runpy.run_path(sys.argv[1], run_name='__main__')"


class ServiceStartError(RuntimeError):
    """The helper process could not start the coordination service (e.g. its port is taken)."""


@dataclass(frozen=True)
class ServiceHandle:
    """Stands where JAX keeps its in-process service (``distributed.global_state.service``).

    ``shutdown()`` does nothing: the helper stops once every process has left.
    """

    pid: int
    presence_port: int

    def shutdown(self) -> None:
        pass


def start(bind_address: str, num_processes: int, *, heartbeat_timeout: int, shutdown_timeout: int,
          init_timeout: float) -> ServiceHandle:
    """Start the coordination service for ``num_processes`` processes in a helper process.

    Raises:
        ServiceStartError: the helper exited or did not report within 60 s; its message says why.
    """
    spec = {"bind": bind_address, "n": num_processes, "heartbeat": heartbeat_timeout,
            "shutdown": shutdown_timeout, "init": init_timeout}
    # NOTE: a session of its own, so that a signal to process 0's process group leaves the job's service up
    proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__), json.dumps(spec)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, start_new_session=True, text=True)
    line = _first_line(proc, _READY_WAIT)
    if not line.startswith("ready "):
        if proc.poll() is None:
            proc.kill()
        raise ServiceStartError(f"the coordination service helper did not start on {bind_address}: "
                                f"{line.strip() or f'no answer in {_READY_WAIT:g} s'} (exit code {proc.poll()})")
    proc.stdout.close()
    return ServiceHandle(pid=proc.pid, presence_port=int(line.split()[1]))


def _first_line(proc: subprocess.Popen, wait: float) -> str:
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(wait)
    return got[0] if got else ""


def attend(address: tuple[str, int], process_index: int, timeout: float = 10.0) -> None:
    """Open this process's presence connection to the helper; it stays open until the process ends."""
    conn = socket.create_connection(address, timeout=timeout)
    conn.sendall(f"{process_index}\n".encode())
    _PRESENCE.append(conn)


def _listen() -> socket.socket:
    if socket.has_dualstack_ipv6():
        return socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    return socket.create_server(("", 0))


def _serve_presence(server: socket.socket, n: int, init_timeout: float) -> None:
    """Return once every process has connected and left, or the job's processes are gone for good."""
    open_: set[socket.socket] = set()
    seen = 0
    idle_since = time.monotonic()  # nobody connected since this moment
    while True:
        ready, _, _ = select.select([server, *open_], [], [], 1.0)
        for s in ready:
            if s is server:
                conn, _ = server.accept()
                open_.add(conn)
                seen += 1
            elif not s.recv(4096):  # NOTE: EOF: the process ended (exit, crash or SIGKILL alike)
                open_.discard(s)
                s.close()
                if not open_:
                    idle_since = time.monotonic()
        if not open_ and (seen >= n or time.monotonic() - idle_since > init_timeout):
            return


def _probe(bind: str) -> None:
    """Raise ``OSError`` naming ``bind`` if its port is taken.

    NOTE: jaxlib's service crashes (SIGSEGV, about one start in two here) instead of raising
    when it cannot bind, so the helper tries the address itself first.
    """
    host, _, port = bind.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or int(port) == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        socket.create_server((host, int(port)), family=family).close()
    except OSError as err:
        raise OSError(f"the RPC server cannot listen on {bind}: {err.strerror or err}") from None


def main(spec: dict[str, Any]) -> None:
    from jaxlib import _jax
    try:
        _probe(spec["bind"])
        service = _jax.get_distributed_runtime_service(spec["bind"], spec["n"], heartbeat_timeout=spec["heartbeat"],
                                                       shutdown_timeout=spec["shutdown"], recoverable=True)
        server = _listen()
    except Exception as err:  # reported to process 0, which raises ServiceStartError
        print(f"error {type(err).__name__}: {err}", flush=True)
        os._exit(1)
    print(f"ready {server.getsockname()[1]}", flush=True)
    sys.stdout.close()
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)  # NOTE: process 0 may be gone: no writes to its pipe
    _serve_presence(server, spec["n"], spec["init"])
    closer = threading.Thread(target=service.shutdown, daemon=True)
    closer.start()
    closer.join(10.0)
    os._exit(0)


if __name__ == "__main__":
    main(json.loads(sys.argv[-1]))
