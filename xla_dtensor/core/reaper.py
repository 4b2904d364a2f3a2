"""A sync's old graph dropped on a helper thread, not on the thread that records the next step.

When ``sync()`` has rebound every pending storage to its new array, the step's graph is
garbage: ~2,000 nodes and the leaves of the arrays the program read. Dropping it frees
those arrays, and JAX's work per freed array grows with its shards: a 12-layer GPT step's
591 state arrays, split over 8 CPU devices, cost the calling thread ~4 ms to free. JAX
releases the GIL for most of it, so a helper thread frees them while the caller records the
next step. A program on one device is freed by the caller (``executor._sync``): its state is
a few packs (0.26 ms), and there the helper's wake-ups made back-to-back steps slower.

:func:`drop` takes the garbage out of the caller's list and hands it to the helper (started on first
use, again after a fork): the caller keeps no reference the helper could outlive, so the free is the
helper's even when it runs at once;
:func:`drain` waits until all of it is freed: ``sync(wait=True)`` and ``wait()`` drain, so
after them nothing a finished step read is alive. At most :data:`MAX_QUEUED` graphs wait:
beyond that the caller frees its own, so a starved helper never holds more than that in memory.
``config.free_on_helper = False`` frees every graph on the calling thread.

Example:
    >>> from xla_dtensor.core import reaper
    >>> garbage = [object()]
    >>> reaper.drop(garbage)
    >>> garbage
    []
    >>> reaper.drain()
    True
    >>> reaper.queued()
    0
"""
from __future__ import annotations

import atexit
import os
import queue
import threading
from typing import Any

from xla_dtensor.config import config

MAX_QUEUED = 1
"""Graphs that may wait for the helper (one: the previous step's); one more is freed by the caller. A step's
donated arrays hold no memory, but a graph also holds the buffers nothing donated (a pack, an input)."""


class _Reaper:
    """The helper thread and its queue of garbage."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self.waiting = 0  # graphs put and not yet freed
        self.idle = threading.Condition(threading.Lock())
        self.handoff = threading.Lock()  # held by drop until its own names are gone

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="xla_dtensor-reaper", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        get = self.queue.get
        while True:
            garbage = get()
            with self.handoff:  # drop has let go of it
                pass
            del garbage  # NOTE: the whole point: the last reference dies here, on this thread
            with self.idle:
                self.waiting -= 1
                if not self.waiting:
                    self.idle.notify_all()


_REAPER = _Reaper()


def drop(garbage: list[Any]) -> None:
    """Free the items of ``garbage`` (the caller's only references to them) on the helper thread:
    ``garbage`` is emptied. Left as it is, freed when the caller lets go of it, when
    ``config.free_on_helper`` is off or :data:`MAX_QUEUED` graphs already wait."""
    r = _REAPER
    if not config.free_on_helper or r.waiting >= MAX_QUEUED:
        return
    if r.thread is None:
        r.start()
    with r.idle:
        r.waiting += 1
    # NOTE: the helper may run as soon as the item is queued: under the lock until no name here holds it
    with r.handoff:
        items = garbage[:]
        garbage.clear()
        r.queue.put(items)
        del items


def drain(timeout: float | None = None) -> bool:
    """Wait until every graph handed to :func:`drop` is freed, or ``timeout`` seconds; whether it was."""
    r = _REAPER
    if not r.waiting:
        return True
    with r.idle:
        return r.idle.wait_for(lambda: not r.waiting, timeout)


def queued() -> int:
    """Graphs handed to the helper and not yet freed."""
    return _REAPER.waiting


def _after_fork() -> None:
    """A forked child has no helper thread: the next :func:`drop` starts one (what the parent queued is the
    parent's)."""
    global _REAPER
    _REAPER = _Reaper()


os.register_at_fork(after_in_child=_after_fork)
# NOTE: freed before the interpreter tears JAX's backends down, not by a daemon thread during it (a helper stuck
# in some object's finalizer does not hold the exit up for more than a minute)
atexit.register(drain, 60.0)
