"""Integration tests with third-party models (see benchmarks/models/zoo.py).

``XLA_DTENSOR_MATRIX_JSON=path``: every matrix test's outcome (passed / failed / skipped
with the reason, losses' relative error, compiles after warm-up, AUTO's plan summary)
is written there as JSON at the end of the session.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable

import pytest

from benchmarks.models.torchvision_shim import install

install()  # timm and transformers' Mixtral import torchvision, whose C++ ops do not load on CPU torch

_ENV = "XLA_DTENSOR_MATRIX_JSON"
_ROWS: dict[str, dict[str, Any]] = {}


def _row(item: pytest.Item) -> dict[str, Any] | None:
    callspec = getattr(item, "callspec", None)
    if callspec is None or "name" not in callspec.params or "mode" not in callspec.params:
        return None
    return _ROWS.setdefault(item.nodeid, {"model": callspec.params["name"], "mode": callspec.params["mode"]})


@pytest.fixture
def matrix_record(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record(**facts)`` stores facts about this (model, mode) for the JSON report."""
    def record(**facts: Any) -> None:
        row = _row(request.node)
        if row is not None:
            row.update(facts)
    return record


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Any:
    outcome = yield
    rep = outcome.get_result()
    row = _row(item)
    if row is None or (rep.when != "call" and not rep.skipped and not rep.failed):
        return
    if rep.skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        row.update(outcome="skipped", reason=reason.removeprefix("Skipped: "))
    elif rep.failed:
        row.update(outcome="failed", reason=str(call.excinfo.value).splitlines()[0][:300] if call.excinfo else "")
    elif rep.when == "call":
        row.update(outcome="passed", seconds=round(rep.duration, 2))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The matrix runs last: its worker process, started when collection ends, trains cells in the
    background meanwhile (test_matrix.py's module doc)."""
    matrix = [item for item in items if item.path.name == "test_matrix.py" and item.path.parent.name == "integration"]
    if matrix:
        last = set(matrix)
        items[:] = [item for item in items if item not in last] + matrix


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(_ENV)
    if path and _ROWS:
        with open(path, "w") as f:
            json.dump(sorted(_ROWS.values(), key=lambda r: (r["model"], r["mode"])), f, indent=1, default=str)


@pytest.fixture(autouse=True)
def _release_executables_per_case(request: pytest.FixtureRequest):
    """Each matrix case builds and compiles its own model: its programs go when it ends (the
    80 cases of one module would otherwise pass the kernel's memory-map limit; see tests/conftest.py).
    A case the matrix worker process trained compiled nothing here."""
    yield
    if getattr(request.node, "trained_elsewhere", False):
        return
    from tests.conftest import release_executables
    release_executables()

