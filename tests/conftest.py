"""Shared test setup: 8 virtual CPU devices, and caches kept out of the user's home."""
from __future__ import annotations

import os
import tempfile

# Plans and compiled programs land in a per-run temporary folder, so tests neither read
# a developer's cache nor leave files behind (subprocesses inherit the variable).
os.environ.setdefault("XLA_DTENSOR_CACHE_DIR", tempfile.mkdtemp(prefix="xla_dtensor_test_cache_"))

# XLA's LLVM backend at -O0: programs here are tiny and compiled once each, so compile time
# dominates; -O0 cuts the suite's CPU time by ~20% (HLO passes, numerics and collectives unchanged).
if "--xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import gc  # noqa: E402
import sys  # noqa: E402
from typing import Any  # noqa: E402

import mesh  # noqa: E402,F401  (must precede any jax import: sets the virtual device count)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def dev():
    """The lazy ``jax`` torch device."""
    import xla_dtensor
    return xla_dtensor.device()


def release_executables() -> None:
    """Drop the lazy core's, eager mode's and JAX's compiled programs (if the library is loaded).

    NOTE: each XLA:CPU executable holds ~6 memory maps; kept for the whole session, the
    suite's programs passed the kernel's vm.max_map_count (65,530) at ~40% of the run and
    XLA segfaulted in a compile.
    """
    if "xla_dtensor.core.executor" in sys.modules:
        from xla_dtensor.core import executor
        executor.release_executables()
        gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _release_executables_per_module():
    """Modules compile their programs once each: none is needed by the next module."""
    yield
    release_executables()



@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The selected tests of tests/_offload.py's modules go to the end, shared with one background pytest run."""
    from tests import _offload
    _offload.offload(config, items)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """A test of tests/_offload.py's modules that the background pytest took runs there: its proxy runs here."""
    from tests import _offload
    return _offload.protocol(item, nextitem)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Each selected module's ``start_early(session)``, in session order: its fresh-process work
    begins now in the background (tests/_parallel.py); then the offloaded modules' run (tests/_offload.py)."""
    if session.config.option.collectonly:
        return
    seen = set()
    for item in session.items:
        module = getattr(item, "module", None)
        if module is not None and module not in seen:
            seen.add(module)
            start = getattr(module, "start_early", None)
            if start is not None:
                start(session)
    from tests import _offload
    _offload.queue(session.config)


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Which process ran the offloaded modules (tests/_offload.py)."""
    from tests import _offload
    line = _offload.summary(config)
    if line:
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Background work still running when the session ends is stopped (tests/_parallel.py)."""
    from tests import _parallel
    _parallel.stop()
