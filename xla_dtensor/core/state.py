"""The lazy core's mutable state, in one object: who is inside the core, and in which mode.

Everything the core switches at run time lives on :data:`STATE` (one
:class:`CoreState`), changed only through the context managers and functions here or
by the lock holder (:mod:`.threads`); the rest of the library reads it, never sets it.

* ``owner``: the thread whose op the lock holder is running (0 outside the core).
* ``eager``: the lock holder's mode runs each op at once (``xla_dtensor.eager_mode``);
  ``suspended`` counts :func:`suspended` blocks (``compile`` tracing inside eager mode);
  ``consing`` (hash-consing on) is ``not eager or suspended``, kept as a field because
  every recorded node reads it.
* ``capturing``: ``xla_dtensor.compile`` records a call; ``capture_log`` lists its host
  reads and host-made leaves (see :func:`capturing`).
* ``deferring``: ``sync()`` runs its pre-sync hooks; ``deferred`` holds the constraint
  tables they hand to the sync's own graph walk (see :func:`deferring`), ``held`` the
  output shardings they ask for the pending storages (see :func:`hold`).

Example:
    >>> with capturing() as log:
    ...     STATE.capturing
    True
    >>> STATE.capturing, log
    (False, [])
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Iterator


@dataclasses.dataclass(slots=True)
class CoreState:
    """The lazy core's switches (see the module doc)."""

    owner: int = 0
    multi: bool = False  # a second thread has used the device
    first_thread: int = 0  # the first thread that did
    no_queue: bool = False  # torch's autograd engine has no queue for the device (core.device)
    eager: bool = False
    eager_state: Any = None  # the installed eager mode's object (None: lazy)
    suspended: int = 0
    consing: bool = True
    capturing: bool = False
    capture_log: list = dataclasses.field(default_factory=list)
    deferring: bool = False
    deferred: list = dataclasses.field(default_factory=list)
    held: list | None = None
    debugging: bool = False  # xla_dtensor.debug explains every compile (eager mode then takes the full path)
    modes: dict[int, Any] = dataclasses.field(default_factory=dict)  # owner -> its eager-mode object

    def runs_at_once(self) -> bool:
        """Whether the op being recorded runs at once (eager mode, not tracing for ``compile``)."""
        return self.eager and not self.suspended


STATE = CoreState()


def install(mode: Any) -> None:
    """Make ``mode`` (an eager-mode object; None: lazy) the core's mode for the lock holder."""
    STATE.eager_state = mode
    STATE.eager = mode is not None
    STATE.consing = mode is None or bool(STATE.suspended)


def install_for(owner: int) -> None:
    """Install ``owner``'s mode if another one is installed (called by the lock holder)."""
    if STATE.modes or STATE.eager_state is not None:
        mode = STATE.modes.get(owner)
        if mode is not STATE.eager_state:
            install(mode)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Record lazily inside this block even in eager mode (``compile`` while it traces)."""
    STATE.suspended += 1
    consing, STATE.consing = STATE.consing, True  # a traced graph shares nodes as in lazy mode
    try:
        yield
    finally:
        STATE.suspended -= 1
        STATE.consing = consing


@contextlib.contextmanager
def capturing() -> Iterator[list]:
    """Mark ops as recorded by ``compile``; yields the log of this capture (filled as it runs).

    Nested captures each get their own log; the outer one's is restored after.
    """
    outer_flag, outer_log = STATE.capturing, STATE.capture_log
    log: list = []
    STATE.capturing, STATE.capture_log = True, log
    try:
        yield log
    finally:
        STATE.capturing, STATE.capture_log = outer_flag, outer_log


@contextlib.contextmanager
def deferring() -> Iterator[list]:
    """``sync()``'s pre-sync hooks run inside: yields the list they queue constraint tables on."""
    STATE.deferred = []
    STATE.held = None
    STATE.deferring = True
    try:
        yield STATE.deferred
    finally:
        STATE.deferring = False


def log_capture(entry: tuple) -> None:
    """Append ``entry`` to the running capture's log (no-op outside a capture)."""
    if STATE.capturing:
        STATE.capture_log.append(entry)


def defer(table: Any) -> bool:
    """Queue a constraint table on the running sync's walk; False outside a sync's hooks."""
    if not STATE.deferring:
        return False
    STATE.deferred.append(table)
    return True


def hold(shardings: list) -> bool:
    """Ask the running sync to compute its pending storages' values in ``shardings`` (one per storage, in the
    order the hooks got them; None: as XLA propagates), as the program's output shardings instead of
    constraint nodes; False outside a sync's hooks (the caller then adds the constraints itself)."""
    if not STATE.deferring:
        return False
    STATE.held = shardings
    return True
