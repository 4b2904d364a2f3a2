"""Whole test modules run in one background pytest process while the test process runs the rest.

The default run keeps one test process busy on one core; the background lane of
:mod:`tests._parallel` uses the second core for fresh-process work, and is idle for the last
two thirds of the run. The modules in :data:`MODULES` (self-contained: no fresh processes, no
timing, no early jobs of their own; ~6 minutes of the 2-core machine's run) are handed to one
child ``pytest`` of their selected tests, queued on that lane after the other early jobs. Their sum is
set so the child ends about when the test process does. The child runs at a lower priority beside it,
and takes about 2.3x a module's in-process time there: with 27 s more of them, the run's first proxy
waited 80 s for it on a fresh clone (December 2026). In the
test process each of their tests is a :class:`Proxy` with the same node id, placed at the end of
the run: it waits for the child and passes, fails (with the child's report) or skips (with its
reason) as its test did there. A test the child never reported (it crashed) fails with the
child's output.

Nothing is offloaded when the selection is only these modules (nothing to overlap), with
``--collect-only``, in the child itself, or with ``XLA_DTENSOR_TEST_OFFLOAD=0``.

In the child, this module is also the plugin (``-p tests._offload``) that writes each test's
outcome as a JSON line to ``$XLA_DTENSOR_TEST_REPORT``.

Example (what a proxy reads, from a report line):
    >>> _record(json.loads('{"nodeid": "t.py::a", "when": "call", "outcome": "passed", "text": ""}'), {})
    {'t.py::a': ('passed', '')}
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import _parallel

ROOT = Path(__file__).resolve().parents[1]
MODULES = (  # in-process seconds on the 2-core machine (--durations=0, November 2026)
    "tests/xla_dtensor/auto/test_hf_auto.py",  # 39
    "tests/xla_dtensor/ops/test_fused_attention_pattern.py",  # 49
    "tests/xla_dtensor/ops/test_fused_attention.py",  # 35
    "tests/xla_dtensor/auto/test_auto_clustered.py",  # 33
    "tests/xla_dtensor/core/test_training.py",  # 33
    "tests/xla_dtensor/core/test_autocast.py",  # 32
    "tests/xla_dtensor/ops/test_fused_optim.py",  # 33
    "tests/xla_dtensor/fastpath/test_compile_sharded.py",  # 37
    "tests/xla_dtensor/ops/test_nn_matmul.py",  # 27
    "tests/xla_dtensor/ops/test_moe_complex.py",  # 15 (these five: December 2026)
    "tests/xla_dtensor/ops/test_creation_cast_foreach.py",  # 13
    "tests/xla_dtensor/ops/test_reduction_sort.py",  # 13
    "tests/xla_dtensor/ops/test_shape_indexing.py",  # 10
    "tests/xla_dtensor/ops/test_random.py",  # 10
)
CHILD, REPORT, SWITCH = "XLA_DTENSOR_TEST_CHILD", "XLA_DTENSOR_TEST_REPORT", "XLA_DTENSOR_TEST_OFFLOAD"
JOB = "offloaded modules"


class _Child:
    """The child's run of ``nodeids``: queued on the lane, its outcomes (or error) taken once."""

    def __init__(self, nodeids: list[str]) -> None:
        self.run = lambda: _run_child(nodeids)
        self.done: tuple[bool, Any] | None = None

    def result(self) -> dict[str, Any]:
        if self.done is None:
            try:
                self.done = True, _parallel.early(JOB, self.run)
            except Exception as err:  # noqa: BLE001 - raised again by every proxy
                self.done = False, err
        ok, value = self.done
        if not ok:
            raise value
        return value


_KEY = pytest.StashKey[_Child]()


class Proxy(pytest.Item):
    """A test run by the background child: its outcome there, here."""

    def runtest(self) -> None:
        outcomes = self.config.stash[_KEY].result()
        got = outcomes["tests"].get(self.nodeid)
        if got is None:
            pytest.fail(f"the background pytest process did not report this test (exit {outcomes['rc']}):\n"
                        f"{outcomes['output'][-3000:]}", pytrace=False)
        outcome, text = got
        if outcome == "skipped":
            pytest.skip(text)
        if outcome != "passed":
            pytest.fail(f"{outcome} in the background pytest process (tests/_offload.py):\n{text}", pytrace=False)

    def reportinfo(self) -> tuple[Path, int, str]:
        return self.path, 0, self.name


def offload(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Replace the selected tests of :data:`MODULES` in ``items`` by proxies at the end (see the module doc)."""
    if os.environ.get(CHILD) or os.environ.get(SWITCH) == "0" or config.option.collectonly:
        return
    mine = {str(ROOT / m) for m in MODULES}
    moved = [it for it in items if str(it.path) in mine]
    if not moved or len(moved) == len(items):
        return
    kept = [it for it in items if str(it.path) not in mine]
    proxies = [Proxy.from_parent(it.parent, name=it.name) for it in moved]
    for proxy, it in zip(proxies, moved):
        proxy.module = it.module  # hooks that scan the session's items read it
    config.stash[_KEY] = _Child([it.nodeid for it in moved])
    items[:] = kept + proxies


def queue(config: pytest.Config) -> None:
    """Queue the child on the background lane (after the modules' own early jobs)."""
    if _KEY in config.stash:
        _parallel.start_early(JOB, config.stash[_KEY].run)


def _run_child(nodeids: list[str]) -> dict[str, Any]:
    report = _parallel.scratch("offload") / "report.jsonl"
    env = _parallel.child_env(dict(os.environ, **{CHILD: "1", REPORT: str(report)}), JOB.replace(" ", "_"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests._offload",
           "-o", "addopts=", *nodeids]
    proc = _parallel.run(cmd, timeout=3600, env=env, cwd=ROOT)
    tests: dict[str, tuple[str, str]] = {}
    if report.exists():
        for line in report.read_text().splitlines():
            _record(json.loads(line), tests)
    return {"tests": tests, "rc": proc.returncode, "output": proc.stdout + proc.stderr}


def _record(rep: dict, tests: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str]]:
    """Fold one report line into ``tests`` (node id -> (outcome, text)): the first failure or skip of a
    test's setup, call or teardown is its outcome; a passed call is, unless its teardown then fails."""
    prev = tests.get(rep["nodeid"])
    if prev is None or prev[0] == "passed":
        if rep["outcome"] != "passed" or rep["when"] == "call":
            tests[rep["nodeid"]] = (rep["outcome"] if rep["outcome"] != "failed" or rep["when"] == "call"
                                    else f"error in {rep['when']}", rep["text"])
    return tests


# ---- the child's plugin ----

def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get(REPORT)
    if not path:
        return
    if report.skipped and isinstance(report.longrepr, tuple):  # (path, line, "Skipped: reason")
        where, line, why = report.longrepr
        text = f"{why.removeprefix('Skipped: ')} ({where}:{line})"
    elif report.skipped:
        text = str(report.longrepr)
    else:
        text = report.longreprtext
    with open(path, "a") as f:
        f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                            "text": text}) + "\n")
