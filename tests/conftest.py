"""Shared test setup: 8 virtual CPU devices, and caches kept out of the user's home."""
from __future__ import annotations

import os
import tempfile
from importlib.metadata import PackageNotFoundError, version

# Plans and compiled programs land in a per-run temporary folder, so tests neither read
# a developer's cache nor leave files behind (subprocesses inherit the variable).
os.environ.setdefault("XLA_DTENSOR_CACHE_DIR", tempfile.mkdtemp(prefix="xla_dtensor_test_cache_"))


def _compile_flags(flags: str) -> str:
    """``flags`` plus XLA:CPU's cheapest compile settings (any given already are left alone).

    Programs here are tiny and compiled once each, so compiling is about half the suite's CPU time:
    - LLVM at -O0 cut the suite's CPU time by ~20% (HLO passes, numerics and collectives unchanged);
    - the older loop emitters instead of XLA:CPU's MLIR fusion emitters, and each program's LLVM module
      compiled in one piece, not split over threads (both cores are busy here anyway): 143 -> 46 ms of CPU
      a compile of 48 small programs, December 2026. XLA aborts on a flag it does not know, so these two
      are set only for the jaxlib they were measured with (``constraints-dev.txt``'s 0.10).

    Example:
        >>> _compile_flags("--xla_cpu_use_fusion_emitters=true").split()[0]
        '--xla_cpu_use_fusion_emitters=true'
    """
    wanted = {"xla_backend_optimization_level": "0"}
    try:
        if version("jaxlib").startswith("0.10."):
            wanted.update(xla_cpu_use_fusion_emitters="false", xla_cpu_parallel_codegen_split_count="1")
    except PackageNotFoundError:
        pass
    extra = [f"--{name}={value}" for name, value in wanted.items() if f"--{name}=" not in flags]
    return " ".join([flags.strip(), *extra]).strip()


os.environ["XLA_FLAGS"] = _compile_flags(os.environ.get("XLA_FLAGS", ""))

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
    """Drop the lazy core's, eager mode's and JAX's compiled programs (if the library is loaded), collect
    the garbage, and freeze what is left.

    NOTE: each XLA:CPU executable holds ~6 memory maps; kept for the whole session, the
    suite's programs passed the kernel's vm.max_map_count (65,530) at ~40% of the run and
    XLA segfaulted in a compile. The freeze (``gc.freeze``) keeps the objects alive then (imported
    modules, session fixtures: ~400,000-700,000) out of every later collection, this one's included:
    a full collection here took 0.4-0.7 s, ~100 s of the default run's test process.
    """
    if "xla_dtensor.core.executor" in sys.modules:
        from xla_dtensor.core import executor
        executor.release_executables()
    gc.collect()
    gc.freeze()


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
    """Background work still running when the session ends is stopped (tests/_parallel.py), and the objects
    :func:`release_executables` froze go back to the collector (else the interpreter's exit never frees
    them, and jaxlib's bindings report them as leaked)."""
    from tests import _parallel
    _parallel.stop()
    gc.unfreeze()
