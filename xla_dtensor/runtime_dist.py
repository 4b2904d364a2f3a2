"""Multi-device / multi-process runtime: device counts, ``use_spmd`` and the multi-process start.

``initialize_distributed`` joins a multi-process job (``jax.distributed.initialize``) so
that a failed peer is a Python exception, not a C++ abort (see its docstring and
docs/spmd.md, "Several processes"). The rest is re-exported from
:mod:`xla_dtensor.spmd.runtime` (``xla_dtensor.runtime`` re-exports all of it).

Example:
    >>> from xla_dtensor import runtime_dist
    >>> runtime_dist.global_runtime_device_count()
    8
"""
from __future__ import annotations

import atexit
import ctypes
import logging
import math
import os
import socket
import threading
import time
from typing import Any

import jax

from xla_dtensor import coordination_service
from xla_dtensor.core import peer_errors
from xla_dtensor.core.peer_errors import PeerFailureError
from xla_dtensor.spmd.runtime import (
    addressable_runtime_device_count,
    get_1d_mesh,
    global_runtime_device_count,
    is_spmd,
    process_count,
    process_index,
    use_spmd,
)

__all__ = [
    "PeerFailureError", "addressable_runtime_device_count", "get_1d_mesh", "global_runtime_device_count",
    "initialize_distributed", "is_spmd", "process_count", "process_index", "use_spmd",
]

_log = logging.getLogger("xla_dtensor.spmd")
DEFAULT_PEER_TIMEOUT = 30.0  # seconds without a heartbeat before a peer counts as failed
DEFAULT_INIT_TIMEOUT = 60.0  # seconds for every process to join
_COLLECTIVE_GRACE = 15.0  # a blocked CPU collective gives up this much after the heartbeat timeout
_EXIT_KEY = "xla_dtensor/exited/"
_PRESENCE_KEY = "xla_dtensor/service_presence"  # the helper's presence port (coordination_service)
_STATE: dict[str, Any] = {"stop": threading.Event(), "watchdog": None, "main": None, "hosted": False}
_ABANDONED: list[Any] = []  # a join given up on: JAX's client and service, still connecting


def _seconds(value: Any, name: str, env: str, default: float) -> float:
    if value is None:
        value = os.environ.get(env, default)
    try:
        out = float(value)
    except (TypeError, ValueError):
        out = float("nan")
    if not (math.isfinite(out) and out > 0):
        raise ValueError(f"{name} must be a positive number of seconds (or ${env}), got {value!r}")
    return out


def _add_xla_flag(flag: str, value: Any) -> None:
    flags = os.environ.get("XLA_FLAGS", "")
    if f"--{flag}=" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --{flag}={value}".strip()


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, local_device_ids: Any = None,
                           cpu_collectives: str | None = "gloo", peer_timeout: float | None = None,
                           init_timeout: float | None = None, service_process: bool | None = None,
                           **kwargs: Any) -> None:
    """Join a multi-process job (``jax.distributed.initialize``); call before any JAX work.

    A process whose peer dies gets a :class:`PeerFailureError` naming it about
    ``peer_timeout`` seconds later (JAX's heartbeat timeout, watched by a thread that
    raises in the main thread); one whose peer never starts gets it after
    ``init_timeout`` seconds. A main thread blocked in a CPU collective with the lost
    process gets it when the collective gives up (``peer_timeout + 15`` s, XLA's
    ``--xla_cpu_collective_timeout_seconds``). JAX's recoverable mode is switched on
    so that the job's coordination service does not abort the survivors. The service
    runs in a helper process that process 0 starts (:mod:`xla_dtensor.coordination_service`),
    so a dead process 0 is a ``PeerFailureError`` too; with ``service_process=False`` it
    runs inside process 0 as in JAX, whose death then aborts the others in C++, and at
    exit process 0 waits for the others to leave (docs/spmd.md).

    On CPU devices the cross-process collectives need an implementation: ``"gloo"``
    (default) sets ``jax_cpu_collectives_implementation``. Arguments default to the
    ``XLA_DTENSOR_COORDINATOR`` / ``XLA_DTENSOR_NUM_PROCESSES`` / ``XLA_DTENSOR_PROCESS_ID``
    environment variables, then to JAX's own detection (cluster environments).

    Args:
        peer_timeout: seconds (default ``$XLA_DTENSOR_PEER_TIMEOUT`` or 30).
        init_timeout: seconds for all processes to join (default ``$XLA_DTENSOR_INIT_TIMEOUT`` or 60).
        service_process: host the coordination service in a helper process (default
            ``$XLA_DTENSOR_SERVICE_PROCESS`` or on; needs the coordinator address, the
            process count and index, given or from the environment variables above).

    Raises:
        PeerFailureError: not every process joined within ``init_timeout``.
        coordination_service.ServiceStartError: the helper could not start the service.
        ValueError: a timeout that is not a positive number.

    Example:
        >>> initialize_distributed("127.0.0.1:12345", 2, 0, peer_timeout=10)  # doctest: +SKIP
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("XLA_DTENSOR_COORDINATOR")
    if num_processes is None and "XLA_DTENSOR_NUM_PROCESSES" in env:
        num_processes = int(env["XLA_DTENSOR_NUM_PROCESSES"])
    if process_id is None and "XLA_DTENSOR_PROCESS_ID" in env:
        process_id = int(env["XLA_DTENSOR_PROCESS_ID"])
    peer_t = _seconds(peer_timeout, "peer_timeout", "XLA_DTENSOR_PEER_TIMEOUT", DEFAULT_PEER_TIMEOUT)
    init_t = _seconds(init_timeout, "init_timeout", "XLA_DTENSOR_INIT_TIMEOUT", DEFAULT_INIT_TIMEOUT)
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
        _add_xla_flag("xla_cpu_collective_timeout_seconds", math.ceil(peer_t + _COLLECTIVE_GRACE))
    jax.config.update("jax_enable_recoverability", True)
    if service_process is None:
        service_process = env.get("XLA_DTENSOR_SERVICE_PROCESS", "1").strip().lower() not in ("0", "false", "no", "")
    hosted = bool(service_process) and None not in (coordinator_address, process_id) and (num_processes or 0) > 1
    _join(coordinator_address, num_processes, process_id, local_device_ids, peer_t, init_t, kwargs, hosted)
    _log.info("joined process %d of %d: %d local / %d global devices", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
    _start_watchdog(peer_t)


def _join(address: str | None, n: int | None, me: int | None, local_ids: Any, peer_t: float, init_t: float,
          kwargs: dict[str, Any], hosted: bool) -> None:
    """``jax.distributed.initialize`` in a helper thread, given up on after ``init_t`` seconds.

    ``hosted``: process 0 starts the service in a helper process first and JAX takes
    that (its ``_jax.get_distributed_runtime_service`` returns the handle during the call).
    """
    from jax._src import distributed
    outcome: dict[str, BaseException] = {}
    jaxlib, handle = distributed._jax, None
    if hosted and me == 0:
        bind = kwargs.get("coordinator_bind_address") or _bind_address(address)
        handle = coordination_service.start(bind, n, heartbeat_timeout=math.ceil(peer_t),
                                            shutdown_timeout=kwargs.get("shutdown_timeout_seconds", 300),
                                            init_timeout=init_t)
        coordination_service.attend(("127.0.0.1", handle.presence_port), 0)
        jaxlib = _ServiceElsewhere(distributed._jax, handle)
    _STATE["hosted"] = hosted

    def run() -> None:
        real, distributed._jax = distributed._jax, jaxlib
        try:
            # NOTE: JAX's own deadline is far later: when it passes, JAX aborts the process in C++
            jax.distributed.initialize(coordinator_address=address, num_processes=n, process_id=me,
                                       local_device_ids=local_ids, heartbeat_timeout_seconds=math.ceil(peer_t),
                                       initialization_timeout=math.ceil(init_t) + 3600, **kwargs)
        except BaseException as err:  # re-raised in the calling thread
            outcome["error"] = err
        finally:
            distributed._jax = real

    worker = threading.Thread(target=run, name="xla_dtensor-join", daemon=True)
    worker.start()
    worker.join(init_t)
    if "error" in outcome:
        raise outcome["error"]
    if worker.is_alive():
        state = distributed.global_state
        # NOTE: kept alive (destroying the service blocks ~5 s) but hidden from JAX's atexit shutdown
        _ABANDONED.extend([state.client, state.service])
        state.client = state.service = None
        raise PeerFailureError(_not_joined(address, n, me, init_t), _absent(n, me))
    if handle is not None:  # the others learn where the helper's presence port is
        distributed.global_state.client.key_value_set(_PRESENCE_KEY, str(handle.presence_port))
    elif hosted:
        try:
            port = int(distributed.global_state.client.blocking_key_value_get(_PRESENCE_KEY, int(init_t * 1000)))
            coordination_service.attend((address.rpartition(":")[0].strip("[]"), port), me)
        except Exception as err:  # process 0 died right after the join
            raise PeerFailureError(f"process 0 did not publish its coordination service within {init_t:g} s "
                                   f"after the join ({err}); this is process {me} of {n}", (0,)) from err


class _ServiceElsewhere:
    """jaxlib's ``_jax`` module for ``jax.distributed.initialize``, except that the service already runs."""

    def __init__(self, real: Any, handle: coordination_service.ServiceHandle) -> None:
        self._real, self._handle = real, handle

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def get_distributed_runtime_service(self, *args: Any, **kwargs: Any) -> coordination_service.ServiceHandle:
        return self._handle


def _bind_address(address: str) -> str:
    """The service's bind address as JAX chooses it: ``$JAX_COORDINATOR_BIND_ADDRESS`` or every interface."""
    return os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or "[::]:" + address.rsplit(":", 1)[1]


def _absent(n: int | None, me: int | None) -> tuple[int, ...]:
    return tuple(p for p in range(n or 0) if p != me)


def _not_joined(address: str | None, n: int | None, me: int | None, init_t: float) -> str:
    if me not in (None, 0) and address and not _reachable(address):
        return (f"process 0 (the coordinator at {address}) did not start within {init_t:g} s; "
                f"this is process {me} of {n}")
    others = ", ".join(str(p) for p in _absent(n, me))
    return (f"not every process joined within {init_t:g} s (init_timeout): process(es) {others} did not "
            f"connect to the coordinator at {address}; this is process {me} of {n}")


def _reachable(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return True
    except (OSError, ValueError):
        return False


def _start_watchdog(peer_t: float) -> None:
    from jax._src import distributed
    client, n, me = distributed.global_state.client, jax.process_count(), jax.process_index()
    if client is None or n < 2 or _STATE["watchdog"] is not None:
        return
    _STATE["stop"].clear()
    period = min(1.0, peer_t / 5)
    t = threading.Thread(target=_watch, args=(client, n, me, period, threading.main_thread().ident),
                         name="xla_dtensor-peer-watchdog", daemon=True)
    _STATE["watchdog"], _STATE["main"] = t, threading.main_thread().ident
    peer_errors.watching(peer_t + 2 * period + 1.0)
    t.start()
    atexit.register(_at_exit, client, n, me, peer_t)


def _watch(client: Any, n: int, me: int, period: float, main_ident: int | None) -> None:
    """Poll the coordination service for live processes; when one is lost, tell the main thread."""
    while not _STATE["stop"].wait(period):
        try:
            live = set(client.get_live_nodes(list(range(n))))
        except Exception as err:  # the service itself is gone: process 0 failed
            _fail(f"process 0 (the JAX coordination service) is unreachable: {err}", (0,), main_ident)
            return
        missing = [p for p in range(n) if p not in live and not _exited(client, p)]
        if missing:
            names = ", ".join(str(p) for p in missing)
            _fail(f"process(es) {names} of {n} stopped answering (no heartbeat for the peer timeout); "
                  f"this is process {me}. The job cannot continue: save what you need locally and exit",
                  tuple(missing), main_ident)
            return


def _exited(client: Any, p: int) -> bool:
    try:
        client.key_value_try_get(f"{_EXIT_KEY}{p}")
        return True
    except Exception:
        return False


def _fail(message: str, missing: tuple[int, ...], main_ident: int | None) -> None:
    _log.error("%s", message)
    if peer_errors.record(message, missing) and main_ident is not None and not _STATE["stop"].is_set():
        _async_raise(main_ident, PeerFailureError)


def _async_raise(ident: int, exc: type[BaseException] | None) -> None:
    """Raise ``exc`` in thread ``ident`` at its next Python instruction (None: cancel a pending one)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


def _at_exit(client: Any, n: int, me: int, peer_t: float) -> None:
    """Mark this process as ended; process 0 (it hosts the service) waits for the others to leave.

    NOTE: in recoverable mode JAX's shutdown has no barrier; a service that stopped before
    a peer disconnected would abort that peer, so process 0 goes last.
    """
    _STATE["stop"].set()
    watchdog = _STATE["watchdog"]
    if watchdog is not None:
        watchdog.join(5.0)
    if _STATE["main"] is not None:
        _async_raise(_STATE["main"], None)  # NOTE: a verdict that came too late must not break JAX's shutdown
    try:
        client.key_value_set(f"{_EXIT_KEY}{me}", "1", allow_overwrite=True)
        if me != 0 or _STATE["hosted"]:  # NOTE: a hosted service stays up until every process has ended
            return
        deadline = time.monotonic() + max(300.0, 4 * peer_t)
        while time.monotonic() < deadline and len(client.get_live_nodes(list(range(n)))) > 1:
            time.sleep(0.05)
    except Exception as err:  # the service or a peer is gone: nothing left to wait for
        _log.warning("waiting for the other processes at exit: %s", err)
