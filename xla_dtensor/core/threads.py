"""Several Python threads on the device: one lock, and which thread owns pending work.

Every entry into the lazy core (an op's ``__torch_dispatch__``, ``sync()``, ``.item()``
/ ``.cpu()``, a ``compile``d call, the ``spmd`` calls that rebind tensors) holds
:data:`LOCK`, a re-entrant lock, so ops, syncs and replays of different threads never
interleave inside the core (their programs still run on the device concurrently).

Ownership: each storage records the thread that last gave it a pending value (created
it, or wrote it in place), its *owner*. ``sync()`` executes the caller's pending
storages, and those whose owner is gone (a finished thread) or unknown (``0``); other
threads' pending graphs stay pending, and no buffer they read is donated.

NOTE: each Python thread's first op on the device switches its backward onto itself
(``config.backward_on_caller``, torch's ``set_multithreading_enabled(False)``). Without
that switch, or when a thread's first op is ``backward()`` itself, torch's autograd
engine runs ``backward()`` of device tensors on its own device thread, so "the calling
thread" of a backward op is not the thread that called ``backward()``. Threads Python did
not start (*borrowed*: torch's autograd threads) never own anything: an op there belongs to the owner of its
first lazy tensor argument (the forward's saved tensors and the incoming gradient
belong to the thread that ran the forward), else to the owner of that thread's last op.

Eager mode is per owner (``STATE.modes``): the lock holder's mode is installed on the
core's state (:func:`.state.install_for`) when it differs from the installed one, so a
borrowed autograd thread runs an eager thread's backward eagerly and a lazy thread's lazily.

Example:
    >>> with held():
    ...     STATE.owner == me()
    True
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, TypeVar

import torch

from xla_dtensor.config import config as _config
from xla_dtensor.core.ir import Node
from xla_dtensor.core.state import STATE, install_for

T = TypeVar("T")

LOCK = threading.RLock()
# NOTE: ``STATE.owner`` is set only by the lock holder and reset before it releases: non-zero means
# "this thread is already inside the core" (a nested op); 0 means a thread entering (see
# LazyTensor.__torch_dispatch__). ``STATE.multi``: a second thread has used the device (until then
# nothing here costs more than the lock).

_USER, _BORROWED = 1, 2


class _Thread(threading.local):
    kind = 0  # 0: not seen yet
    ident = 0
    last = 0  # a borrowed thread: the owner of its last op


_THIS = _Thread()


def _learn() -> int:
    t = _THIS
    t.ident = threading.get_ident()
    t.kind = _BORROWED if isinstance(threading.current_thread(), threading._DummyThread) else _USER
    if t.kind == _USER:
        STATE.modes.pop(t.ident, None)  # a finished thread's (Python reuses idents): a new thread starts lazy
        # backward on this thread: by choice (config.backward_on_caller), or because a backward ran before
        # the device existed and the engine has no queue for it (core.device)
        if STATE.no_queue or _config.backward_on_caller:
            torch._C._set_multithreading_enabled(False)
        if not STATE.first_thread:
            STATE.first_thread = t.ident
        elif STATE.first_thread != t.ident:
            STATE.multi = True
    return t.kind


def _inherit(args: tuple) -> int:
    """The owner of the first lazy tensor in ``args`` (one level into lists), or 0."""
    from xla_dtensor.core.tensor import LazyTensor
    for a in args:
        if isinstance(a, LazyTensor):
            o = a._storage.owner
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], LazyTensor):
            o = a[0]._storage.owner
        else:
            continue
        if o:
            return o
    return 0


def enter(args: tuple) -> int:
    """The owner of an op entering the core with ``args``; installs that owner's mode.

    Called by the lock holder when ``STATE.owner == 0``.
    """
    t = _THIS
    kind = t.kind or _learn()
    if kind == _USER:
        owner = t.ident
    else:
        owner = _inherit(args) or t.last
        t.last = owner
    if STATE.modes or STATE.eager_state is not None:
        install_for(owner)
    return owner


def me() -> int:
    """The owner of what the calling thread records (its ident; a borrowed thread: its last op's owner)."""
    if STATE.owner and LOCK._is_owned():  # type: ignore[attr-defined]
        return STATE.owner
    t = _THIS
    kind = t.kind or _learn()
    return t.ident if kind == _USER else t.last


def in_eager_mode() -> bool:
    """Whether the calling thread runs in eager mode (``xla_dtensor.eager_mode``)."""
    return bool(STATE.modes) and me() in STATE.modes


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold :data:`LOCK` as an entry point outside an op (a compiled call, an ``spmd`` relayout)."""
    with LOCK:
        outer = STATE.owner
        if not outer:
            STATE.owner = enter(())
        try:
            yield
        finally:
            STATE.owner = outer


def locked(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` run under :func:`held` (a decorator for entry points that build IR outside an op)."""
    import functools

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        with held():
            return fn(*args, **kwargs)
    return wrapped


@contextlib.contextmanager
def released() -> Iterator[None]:
    """Let other threads into the core while this one waits for the device (a host transfer).

    Releases :data:`LOCK` completely, also when held by outer frames of this thread, and
    takes it back with this thread's owner and mode. Outer frames must then hold only
    tensors, never IR nodes of a pending value (a sync elsewhere may consume those).
    NOTE: not while ``compile`` records a call: its capture must see only its own ops.
    """
    if STATE.capturing or not LOCK._is_owned():  # type: ignore[attr-defined]
        yield
        return
    owner = STATE.owner
    STATE.owner = 0
    saved = LOCK._release_save()  # type: ignore[attr-defined]
    try:
        yield
    finally:
        LOCK._acquire_restore(saved)  # type: ignore[attr-defined]
        STATE.owner = owner
        install_for(owner)


def alive() -> set[int]:
    """Idents of the running Python threads."""
    return {t.ident for t in threading.enumerate() if t.ident is not None}


def split(items: list[T], owner: Callable[[T], int | None], me: int | None) -> tuple[list[T], list[T]]:
    """``items`` as (those thread ``me`` handles, those of other running threads), order kept.

    Thread ``me`` handles its own, those of no thread (owner 0 or ``None``) and those of a
    thread that has finished; ``me=None``: all of them. :func:`alive` is asked only when
    another thread owns one.
    """
    if me is None:
        return list(items), []
    foreign = [x for x in items if owner(x) and owner(x) != me]
    if foreign:
        running = alive()
        foreign = [x for x in foreign if owner(x) in running]
    if not foreign:
        return list(items), []
    ids = {id(x) for x in foreign}
    return [x for x in items if id(x) not in ids], foreign


def reached_leaves(roots: list[Node]) -> set[int]:
    """ids of the device-data leaves reachable from ``roots``."""
    from xla_dtensor.core.ir import topo_order
    return {id(n) for n in topo_order(roots) if n.fn is None}
