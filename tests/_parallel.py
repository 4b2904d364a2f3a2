"""Tests whose cases each wait on their own fresh process: run the processes two at a time.

The pytest process only waits while a child runs, so on the 2-core machine the default run
uses two children at once to halve the wall time of such a module. Each case keeps its own
process and its own assertions; a case's error is raised in that case's test.

Example:
    >>> from tests._parallel import Results
    >>> r = Results(lambda k: k * 2, ["a", "b"])
    >>> r["b"]
    'bb'
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

WORKERS = 2


class Results:
    """``fn(key)`` for every key, :data:`WORKERS` at a time; ``results[key]`` returns it or raises its error."""

    def __init__(self, fn: Callable[[Any], Any], keys: Iterable[Any]) -> None:
        def call(key: Any) -> tuple[bool, Any]:
            try:
                return True, fn(key)
            except BaseException as err:  # noqa: BLE001 - raised again in the key's own test
                return False, err
        keys = list(keys)
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            self._done = dict(zip(keys, pool.map(call, keys)))

    def __getitem__(self, key: Any) -> Any:
        ok, value = self._done[key]
        if not ok:
            raise value
        return value


def selected(request: pytest.FixtureRequest, param: str) -> list[Any]:
    """The values of parameter ``param`` of this module's tests that the session will run, in order."""
    out = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "module", None) is request.module and param in params and params[param] not in out:
            out.append(params[param])
    return out


def claim(folder: str | Path, name: str) -> bool:
    """Whether the caller takes the item ``name`` from processes sharing ``folder``: it creates the
    item's claim file there first (exclusively)."""
    try:
        os.close(os.open(os.path.join(folder, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
