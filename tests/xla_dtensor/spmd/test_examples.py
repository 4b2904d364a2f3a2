"""Every example under docs/examples runs as docs/spmd.md says: ``.venv/bin/python docs/examples/X.py``
from the repository root, in a fresh process, with no PYTHONPATH (issue 24).

So an example may import only what ``pip install -e .`` ships (``xla_dtensor``,
``autoshard``, ``mesh``), never ``benchmarks`` or ``tests`` (see tests/_fresh_clone.py).
The multi-process example is run the same way by ``test_multiprocess.py``.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from tests import _parallel
from tests._fresh_clone import ROOT, SHIPPED, user_env
from tests._parallel import Results, selected, selected_in

EXAMPLES = sorted(p.name for p in (ROOT / "docs" / "examples").glob("*.py") if p.name != "multiprocess_hybrid.py")


def test_pyproject_ships_the_packages_examples_import():
    text = (ROOT / "pyproject.toml").read_text()
    assert all(f'"{name}*"' in text for name in SHIPPED)


def test_docs_say_how_to_run_the_examples():
    assert ".venv/bin/python docs/examples/" in (ROOT / "docs" / "spmd.md").read_text()


def _runs(names: list[str]) -> Results:
    """Each example in its own fresh process, two at a time (they are independent; on a 2-core machine
    this halves their wall time), the slowest first."""
    env = _parallel.child_env(user_env(_parallel.scratch("site")), __name__)

    def run(name: str) -> subprocess.CompletedProcess:
        return _parallel.run([sys.executable, f"docs/examples/{name}"], cwd=ROOT, env=env, timeout=300)
    return Results(run, sorted(names, key=lambda n: n != "auto_sharding.py"))  # ~3x the others


def start_early(session: pytest.Session) -> None:
    """The selected examples start when collection ends, in the background (tests/_parallel.py)."""
    names = selected_in(session, sys.modules[__name__], "name")
    _parallel.start_early(__name__, lambda: _runs(names))


@pytest.fixture(scope="module")
def example_runs(request) -> Results:
    return _parallel.early(__name__, lambda: _runs(selected(request, "name")))


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs_as_documented(name, example_runs):
    proc = example_runs[name]
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("ok"), proc.stdout[-2000:]  # checked itself
