"""Peer failure in a multi-process job as one Python exception type, wherever it surfaces.

A lost peer shows up in the main thread as a JAX runtime error from a collective
(gloo: "Connection closed by peer", or the collective timeout) or not at all (a hung
peer between collectives). :mod:`xla_dtensor.runtime_dist`'s watchdog decides which
process is lost (JAX's heartbeats) and records it here; :func:`guard` wraps the
executor's blocking calls so that such a runtime error becomes a
:class:`PeerFailureError` naming the process (it waits for the watchdog's verdict, at
most the peer timeout). Nothing here runs in a one-process job.

Example:
    >>> guard(lambda: 1)()
    1
"""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

import jax

F = TypeVar("F", bound=Callable[..., Any])
_STATE: dict[str, Any] = {"watching": False, "wait": 0.0, "failure": None, "translating": 0}
VERDICT = threading.Event()


class PeerFailureError(RuntimeError):
    """Another process of the job died, stopped answering or never started.

    ``missing`` holds the process indices concerned.
    """

    def __init__(self, message: str | None = None, missing: tuple[int, ...] = ()) -> None:
        failure = _STATE["failure"]
        if message is None and failure is not None:  # raised asynchronously by the watchdog
            message, missing = failure
        super().__init__(message or "a peer process failed")
        self.missing = tuple(missing)


def watching(wait: float) -> None:
    """A watchdog runs; a runtime error waits up to ``wait`` seconds for its verdict."""
    _STATE.update(watching=True, wait=wait)


def record(message: str, missing: tuple[int, ...]) -> bool:
    """Record the watchdog's verdict; True when the main thread is not already being told."""
    _STATE["failure"] = (message, missing)
    VERDICT.set()
    return _STATE["translating"] == 0


def failure() -> tuple[str, tuple[int, ...]] | None:
    return _STATE["failure"]


def guard(fn: F) -> F:
    """``fn`` with a JAX runtime error caused by a lost peer re-raised as :class:`PeerFailureError`."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except jax.errors.JaxRuntimeError as err:
            if not _STATE["watching"]:
                raise
            _STATE["translating"] += 1
            try:
                VERDICT.wait(_STATE["wait"])
            finally:
                _STATE["translating"] -= 1
            if _STATE["failure"] is None:
                raise
            raise PeerFailureError(*_STATE["failure"]) from err

    return wrapped  # type: ignore[return-value]
