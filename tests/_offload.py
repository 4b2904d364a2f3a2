"""Whole test modules run in one background pytest process while the test process runs the rest.

The default run keeps one test process busy on one core; the background lane of
:mod:`tests._parallel` uses the second core for fresh-process work, and is idle for the last
two thirds of the run. The modules in :data:`MODULES` (self-contained: no fresh processes, no
timing, no early jobs of their own) are handed to one child ``pytest`` of their selected tests,
queued on that lane after the other early jobs, which runs them in :data:`MODULES`' order at a
lower priority beside the test process. In the test process the same tests come at the end of the
run, their modules in the opposite order, and the two processes share the modules between them:
each takes a module by its claim file (:func:`tests._parallel.claim`) when it reaches the module's
first test, and leaves the module alone if the other took it first. A module the test process
takes runs there as any other; for one the child took, each test is a :class:`Proxy` with the
same node id that waits for that module's tests in the child and passes, fails (with the child's
report) or skips (with its reason) as its test did there. A test the child never reported (it
crashed) fails with the child's output. So the two meet in the middle whatever the machine's
speed: the test process waits at most for the module the child is running then. (With a fixed
share, the child ran ~2.3x a module's in-process time beside the test process, and on a slow day
the run's first proxy waited 272 s for it.) When the test process reaches these modules before
the lane has started the child, the child never starts.

Nothing is offloaded when the selection is only these modules (nothing to overlap), with
``--collect-only``, in the child itself, or with ``XLA_DTENSOR_TEST_OFFLOAD=0``.

In the child, this module is also the plugin (``-p tests._offload``) that writes each test's
outcome as a JSON line to ``$XLA_DTENSOR_TEST_REPORT`` and runs only the modules it claims in
``$XLA_DTENSOR_TEST_CLAIMS``.

Example (what a proxy reads, from report lines: a test is done when its teardown reported):
    >>> lines = [{"nodeid": "t.py::a", "when": "call", "outcome": "passed", "text": ""},
    ...          {"nodeid": "t.py::a", "when": "teardown", "outcome": "passed", "text": ""}]
    >>> _read("".join(json.dumps(line) + "\\n" for line in lines) + '{"node')
    ({'t.py::a': ('passed', '')}, {'t.py::a'})
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _pytest.runner import runtestprotocol

from tests import _parallel

ROOT = Path(__file__).resolve().parents[1]
# The child's order, roughly larger first: in-process seconds on the 2-core machine (--durations=0, November
# 2026). "+": one of the fifteen added with the sharing (December 2026), its slowest tests only (a lower bound);
# the last two were timed on the slower machine of December 2 only, in-process.
MODULES = (
    "tests/xla_dtensor/ops/test_fused_attention_pattern.py",  # 49
    "tests/xla_dtensor/core/test_plan_cache.py",  # 47+
    "tests/xla_dtensor/auto/test_hf_auto.py",  # 39
    "tests/xla_dtensor/fastpath/test_compile_grads.py",  # 39+
    "tests/xla_dtensor/fastpath/test_compile_sharded.py",  # 37
    "tests/xla_dtensor/ops/test_fused_attention.py",  # 35
    "tests/xla_dtensor/auto/test_auto_clustered.py",  # 33
    "tests/xla_dtensor/core/test_training.py",  # 33
    "tests/xla_dtensor/ops/test_fused_optim.py",  # 33
    "tests/xla_dtensor/core/test_autocast.py",  # 32
    "tests/xla_dtensor/auto/test_ir_graph.py",  # 30+
    "tests/xla_dtensor/fastpath/test_compile.py",  # 29+
    "tests/xla_dtensor/ops/test_nn_matmul.py",  # 27
    "tests/xla_dtensor/core/test_phases.py",  # 24+
    "tests/xla_dtensor/spmd/test_gpt2_parallel.py",  # 23+
    "tests/xla_dtensor/ops/test_gpt2_step.py",  # 19+
    "tests/xla_dtensor/auto/test_models_train.py",  # 17+
    "tests/xla_dtensor/ops/test_moe_complex.py",  # 15
    "tests/xla_dtensor/core/test_torchtitan_steady.py",  # 15+
    "tests/xla_dtensor/ops/test_creation_cast_foreach.py",  # 13
    "tests/xla_dtensor/ops/test_reduction_sort.py",  # 13
    "tests/xla_dtensor/core/test_linear_route.py",  # 13+
    "tests/xla_dtensor/core/test_donation_pairing.py",  # 13+
    "tests/xla_dtensor/fastpath/test_shared_scalars.py",  # 11+
    "tests/xla_dtensor/ops/test_shape_indexing.py",  # 10
    "tests/xla_dtensor/ops/test_random.py",  # 10
    "tests/xla_dtensor/spmd/test_sharded_optimizer.py",  # 8+
    "tests/xla_dtensor/fastpath/test_compile_schedules.py",  # 53 (December 2)
    "tests/xla_dtensor/ops/test_elementwise.py",  # 34 (December 2)
)
CHILD, REPORT, SWITCH, CLAIMS = ("XLA_DTENSOR_TEST_CHILD", "XLA_DTENSOR_TEST_REPORT", "XLA_DTENSOR_TEST_OFFLOAD",
                                 "XLA_DTENSOR_TEST_CLAIMS")
JOB = "offloaded modules"
POLL = 0.2  # seconds between a proxy's looks at the child's report


def _claim_name(path: Path) -> str:
    """A module's claim file name: its path from the checkout's root, ``/`` as ``__``."""
    return str(Path(path).resolve().relative_to(ROOT)).replace(os.sep, "__")


class _Child:
    """The child's run of ``nodeids`` (modules in :data:`MODULES`' order), queued on the lane, and which
    modules each process takes."""

    def __init__(self, nodeids: list[str]) -> None:
        folder = _parallel.scratch("offload")
        self.report, self.claims = folder / "report.jsonl", folder / "claims"
        self.claims.mkdir()
        self.run = lambda: _run_child(nodeids, self.report, self.claims)
        self.done: tuple[bool, Any] | None = None
        self.taken: dict[str, bool] = {}  # claim name -> whether the test process runs that module
        self.cancelled: bool | None = None  # whether the child was dropped before it started
        self.waited = 0.0  # seconds the proxies waited for the child

    def mine(self, name: str) -> bool:
        """Whether the test process runs module ``name`` itself (it takes it now if the child has not)."""
        if self.cancelled is None:
            self.cancelled = _parallel.cancel(JOB)
        got = self.taken.get(name)
        if got is None:
            got = self.taken[name] = self.cancelled or _parallel.claim(self.claims, name)
        return got

    def outcomes(self, nodeids: list[str]) -> dict[str, Any]:
        """The child's outcomes, once each of ``nodeids`` has reported its teardown or the child has ended."""
        t0 = time.monotonic()
        try:
            while not _parallel.finished(JOB):
                tests, done = _read(self.report.read_text() if self.report.exists() else "")
                if done.issuperset(nodeids):
                    return {"tests": tests, "rc": None, "output": ""}
                _parallel.hurry()
                time.sleep(POLL)
            return self.result()
        finally:
            self.waited += time.monotonic() - t0

    def summary(self) -> str:
        """One line: which process ran how many of the modules, and how long the proxies waited."""
        here = sum(self.taken.values())
        there = "the background pytest never started" if self.cancelled else \
            f"{len(self.taken) - here} in the background pytest (proxies waited {self.waited:.1f} s)"
        return f"tests/_offload.py: of {len(self.taken)} offloaded modules, {here} ran here, {there}"

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
_MODULE_TESTS = pytest.StashKey[dict[str, list[str]]]()  # a module's path -> the node ids of its selected tests


class Proxy(pytest.Item):
    """A test run by the background child: its outcome there, here."""

    def runtest(self) -> None:
        outcomes = self.config.stash[_KEY].outcomes(self.config.stash[_MODULE_TESTS][str(self.path)])
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


class _Left(pytest.Item):
    """A test of a module the other process took: run without a report, for its place in the setup order
    (its teardown takes down what the next test does not share: the module, its folders)."""

    def runtest(self) -> None:
        pass


def offload(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Move the selected tests of :data:`MODULES` in ``items`` to the end, modules in reverse order, shared
    with a background child (see the module doc)."""
    if os.environ.get(CHILD) or os.environ.get(SWITCH) == "0" or config.option.collectonly:
        return
    order = {str(ROOT / m): i for i, m in enumerate(MODULES)}
    moved = [it for it in items if str(it.path) in order]
    if not moved or len(moved) == len(items):
        return
    kept = [it for it in items if str(it.path) not in order]
    moved.sort(key=lambda it: order[str(it.path)])  # stable: each module's tests keep their order
    by_module: dict[str, list[str]] = {}
    for it in moved:
        by_module.setdefault(str(it.path), []).append(it.nodeid)
    config.stash[_KEY] = _Child([it.nodeid for it in moved])
    config.stash[_MODULE_TESTS] = by_module
    mine = sorted(moved, key=lambda it: -order[str(it.path)])  # stable again: modules reversed, tests not
    items[:] = kept + mine


def queue(config: pytest.Config) -> None:
    """Queue the child on the background lane (after the modules' own early jobs)."""
    if _KEY in config.stash:
        _parallel.start_early(JOB, config.stash[_KEY].run)


def summary(config: pytest.Config) -> str | None:
    """The run's line on the offloaded modules (None when nothing was offloaded or none was reached)."""
    child = config.stash.get(_KEY, None)
    return None if child is None or not child.taken else child.summary()


def protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """The test process's ``pytest_runtest_protocol``: None (run as usual) unless ``item`` belongs to a
    module the child took; then its :class:`Proxy` runs in its place."""
    child = item.config.stash.get(_KEY, None)
    if child is None or str(item.path) not in item.config.stash[_MODULE_TESTS]:
        return None
    if child.mine(_claim_name(item.path)):
        return None
    proxy = Proxy.from_parent(item.parent, name=item.name)
    item.ihook.pytest_runtest_logstart(nodeid=proxy.nodeid, location=proxy.location)
    runtestprotocol(proxy, log=True, nextitem=nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=proxy.nodeid, location=proxy.location)
    return True


def _run_child(nodeids: list[str], report: Path, claims: Path) -> dict[str, Any]:
    env = _parallel.child_env(dict(os.environ, **{CHILD: "1", REPORT: str(report), CLAIMS: str(claims)}),
                              JOB.replace(" ", "_"))
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests._offload",
           "-o", "addopts=", *nodeids]
    proc = _parallel.run(cmd, timeout=3600, env=env, cwd=ROOT)
    tests = _read(report.read_text())[0] if report.exists() else {}
    return {"tests": tests, "rc": proc.returncode, "output": proc.stdout + proc.stderr}


def _read(text: str) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """The report's outcomes so far (node id -> (outcome, text), see :func:`_record`) and the node ids whose
    teardown has reported; a last line still being written is left for the next read."""
    tests: dict[str, tuple[str, str]] = {}
    done: set[str] = set()
    for line in text[:text.rfind("\n") + 1].splitlines():
        rep = json.loads(line)
        _record(rep, tests)
        if rep["when"] == "teardown":
            done.add(rep["nodeid"])
    return tests, done


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

_TAKEN: dict[str, bool] = {}  # in the child: claim name -> whether it runs that module


def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> bool | None:
    """In the child: run ``item`` as usual if its module is the child's (taken now if the test process has
    not), else only its place in the setup order (:class:`_Left`)."""
    claims = os.environ.get(CLAIMS)
    if not claims:
        return None
    name = _claim_name(item.path)
    if name not in _TAKEN:
        _TAKEN[name] = _parallel.claim(claims, name)
    if _TAKEN[name]:
        return None
    runtestprotocol(_Left.from_parent(item.parent, name=item.name), log=False, nextitem=nextitem)
    return True


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
