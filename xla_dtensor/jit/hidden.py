"""Python values a compiled function reads from its globals and closure: part of its signature.

A replay runs no Python, so a value the function reads from outside its arguments (a
global flag, a closure's step counter, a config dict) is frozen at its traced value. The
common case is caught here: the names the function's own code loads as globals or from its
closure (also inside its lambdas and comprehensions) are watched, and on every call the
current value of each that is a Python scalar, or a small container of them, joins the
signature: a changed value traces (or reuses) the program for that value. A container
that cannot be watched (larger than ``MAX_ITEMS`` or holding other objects) gets one
warning naming it, as does a variable that has taken ``CHURN`` values (a step counter:
each value is a program of its own). Not seen: values read by the functions it calls, and attributes of
objects (``self.flag``, ``cfg.lr``); the periodic re-check catches those.

Example:
    >>> LIMIT = 3
    >>> def f(x):
    ...     return x * LIMIT
    >>> Hidden(f).key()
    (('LIMIT', (<class 'int'>, 3)),)
"""
from __future__ import annotations

import dis
import types
import warnings
from typing import Any, Callable

MAX_ITEMS = 64
CHURN = 8  # distinct values of one variable after which compile says it keeps changing
_SCALARS = (int, float, bool, str, complex, bytes, type(None))
_CONTAINERS = (tuple, list, dict, set, frozenset)
_MISSING = object()


class HiddenStateWarning(UserWarning):
    """A compiled function reads a global or closure container that compile cannot watch."""


def _loads(code: types.CodeType, freevars: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """Global names and closure names loaded by ``code`` and the code objects nested in it."""
    globs: set[str] = set()
    cells: set[str] = set()
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            globs.add(ins.argval)
        elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF") and ins.argval in freevars:
            cells.add(ins.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            g, c = _loads(const, freevars)
            globs |= g
            cells |= c
    return globs, cells


def snapshot(v: Any, depth: int = 0) -> Any:
    """A hashable picture of ``v`` if it is a Python scalar or a small container of them;
    ``_MISSING`` if it holds no Python data (a module, function, tensor, list of tensors);
    ``None`` if it cannot be watched (a container that is too large or too deep, or mixes
    scalars with other objects).

    Example:
        >>> snapshot({"add": False})
        (<class 'dict'>, (((<class 'str'>, 'add'), (<class 'bool'>, False)),))
    """
    tp = type(v)
    if tp in _SCALARS:
        return (tp, v)
    if tp not in _CONTAINERS:
        return _MISSING
    if depth > 2 or len(v) > MAX_ITEMS:
        return None if depth > 2 or any(type(x) in _SCALARS for x in _first(v)) else _MISSING
    items = sorted(v, key=repr) if tp in (set, frozenset) else (v.items() if tp is dict else v)
    out = []
    for it in items:
        parts = [snapshot(x, depth + 1) for x in (it if tp is dict else (it,))]
        if None in parts:
            return None
        out.append(tuple(parts) if tp is dict else parts[0])
    data = [x for x in out if x is not _MISSING and not (tp is dict and _MISSING in x)]
    if len(data) == len(out):
        return (tp, tuple(out))
    return _MISSING if not data else None


def _first(v: Any) -> list:
    """Up to ``MAX_ITEMS`` values of a container (a dict's values)."""
    vals = v.values() if isinstance(v, dict) else v
    out = []
    for x in vals:
        if len(out) == MAX_ITEMS:
            break
        out.append(x)
    return out


class Hidden:
    """The globals and closure cells ``fn``'s code reads (see the module docstring)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        f = getattr(fn, "__func__", fn)
        code = getattr(f, "__code__", None)
        self._globals: dict = getattr(f, "__globals__", {}) or {}
        self._names: tuple[str, ...] = ()
        self._cells: tuple[tuple[str, Any], ...] = ()
        self._warned: set[str] = set()
        self._seen: dict[str, set] = {}  # name -> distinct values seen, up to CHURN
        self._qualname = getattr(f, "__qualname__", repr(fn))
        if code is None:
            return
        globs, cells = _loads(code, code.co_freevars)
        self._names = tuple(sorted(globs))
        closure = f.__closure__ or ()
        self._cells = tuple((n, c) for n, c in zip(code.co_freevars, closure) if n in cells)

    def key(self) -> tuple:
        """``((name, snapshot), ...)`` of the watched values that are Python data now."""
        out = []
        g = self._globals
        for name in self._names:
            v = g.get(name, _MISSING)
            if v is not _MISSING:
                self._add(out, name, v, "global")
        for name, cell in self._cells:
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell (assigned later in the enclosing function)
                continue
            self._add(out, name, v, "closure variable")
        return tuple(out)

    def _add(self, out: list, name: str, v: Any, kind: str) -> None:
        s = snapshot(v)
        if s is _MISSING:
            return
        if s is None:
            if name not in self._warned:
                self._warned.add(name)
                warnings.warn(HiddenStateWarning(
                    f"compile({self._qualname}) reads {kind} {name!r}, a {type(v).__name__} that compile cannot "
                    f"watch (more than {MAX_ITEMS} items, or values other than Python scalars): a change to it "
                    f"between calls is not seen until the periodic re-check (config.compile_check_every). Pass "
                    f"it as an argument"), stacklevel=4)
            return
        seen = self._seen.setdefault(name, set())
        if len(seen) < CHURN:
            seen.add(s)
            if len(seen) == CHURN and name not in self._warned:
                self._warned.add(name)
                warnings.warn(HiddenStateWarning(
                    f"compile({self._qualname}) has seen {CHURN} values of {kind} {name!r}: each value traces (and "
                    f"may compile) a program of its own. Pass a value that changes every call as a tensor argument"),
                    stacklevel=4)
        out.append((name, s))
