"""Every code block of README.md and docs/*.md runs and shows what it prints (issue 25).

How blocks are run and marked is documented in docs/README.md. The fast blocks run in
two child interpreters at once that split the pages (each page in one of them, one namespace
per page); blocks marked ``<!-- docs-test: slow -->`` run likewise, only with ``-m slow``
(``python3 dev.py test -m slow tests/docs``). The child runs blocks as if pasted into
``python`` started in the repository root.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from _doc_blocks import ROOT, all_blocks, pages
from tests import _parallel
from tests._fresh_clone import user_env
from tests._parallel import selected_in

HERE = Path(__file__).resolve().parent
BLOCKS = all_blocks()
RUN = [b for b in BLOCKS if b.kind not in ("text", "unlabelled") and b.mark != "skip"]
KNOWN_MARKS = {"", "slow", "skip"}


RUNNERS = 2  # child runners sharing the pages (a 2-core machine: about half the wall time of one)


def _run(tier: str) -> tuple[dict[str, dict], str]:
    """Run the tier's pages in :data:`RUNNERS` children at once, each page in the one that claims it."""
    tmp = _parallel.scratch(f"docs_{tier}")
    claims = tmp / "claims"
    claims.mkdir()
    env = _parallel.child_env(user_env(tmp), f"docs_{tier}")
    results = [tmp / f"{tier}-{i}.jsonl" for i in range(RUNNERS)]
    procs = [_parallel.popen([sys.executable, str(HERE / "_doc_runner.py"), tier, str(r), "", str(claims)],
                             cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in results]
    stderr = []
    for proc in procs:
        try:
            stderr.append(proc.communicate(timeout=1200)[1][-4000:])
        finally:
            proc.kill()
    rows = [row for r in results if r.exists() for row in r.read_text().splitlines()]
    return {r["id"]: r for r in map(json.loads, rows)}, "\n".join(stderr)


def start_early(session: pytest.Session) -> None:
    """The selected tiers start when collection ends, in the background (tests/_parallel.py)."""
    module = sys.modules[__name__]
    for tier in sorted({b.mark or "fast" for b in selected_in(session, module, "block")}):
        _parallel.start_early(f"{__name__}.{tier}", lambda tier=tier: _run(tier))


@pytest.fixture(scope="module")
def fast_results():
    return _parallel.early(f"{__name__}.fast", lambda: _run("fast"))


@pytest.fixture(scope="module")
def slow_results():
    return _parallel.early(f"{__name__}.slow", lambda: _run("slow"))


@pytest.mark.parametrize("block", [
    pytest.param(b, id=b.id, marks=[pytest.mark.slow] if b.mark == "slow" else []) for b in RUN])
def test_block(block, request):
    results, stderr = request.getfixturevalue("slow_results" if block.mark == "slow" else "fast_results")
    row = results.get(block.id)
    assert row is not None, f"the doc runner stopped before {block.id}:\n{stderr}"
    assert row["status"] == "pass", f"{block.id} ({block.kind} block):\n{row['detail']}"


def test_every_block_is_labelled_and_marks_are_known():
    bad = [f"{b.id}: no language after the fence (python, bash, text, ...)" for b in BLOCKS if b.kind == "unlabelled"]
    bad += [f"{b.id}: unknown mark {b.mark!r} (allowed: slow, skip REASON)" for b in BLOCKS if b.mark not in KNOWN_MARKS]
    bad += [f"{b.id}: skip without a reason" for b in BLOCKS if b.mark == "skip" and not b.reason]
    assert not bad, "\n".join(bad)
    assert len(RUN) >= 10  # the runner found the blocks at all


_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
_TICKED = re.compile(r"`([\w.\-]+(?:/[\w.\-]+)+\.(?:py|md|toml|txt|json|png|jsonl|csv))`")


def test_docs_reference_only_files_in_the_repository():
    """Links and backticked paths name files that exist (no design notes outside the repo)."""
    missing = []
    for page in pages():
        text = page.read_text()
        for target in _LINK.findall(text):
            if "://" not in target and not (page.parent / target).exists() and not (ROOT / target).exists():
                missing.append(f"{page.relative_to(ROOT)}: link {target}")
        for path in _TICKED.findall(text):
            if not (ROOT / path).exists() and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: `{path}`")
    assert not missing, "\n".join(missing)


def test_runner_catches_drift():
    """The runner's own oracle: wrong values, outputs and commands fail; right ones pass."""
    from _doc_blocks import Block
    from _doc_runner import run_block

    def status(lang: str, text: str, output: str | None = None) -> str:
        return run_block(Block("t.md", 1, lang, text, output=output), {}, {"PATH": "/usr/bin:/bin"})[0]

    assert status("python", "x = 2\nx + 1  # -> 3\n") == "pass"
    assert status("python", "x = 2\nx + 1  # -> 4\n") == "fail"
    assert status("python", "print('a' * 3)\n", output="aaa\n") == "pass"
    assert status("python", "print('a' * 3)\n", output="aab\n") == "fail"
    assert status("python", "[1, 2, 3, 4]  # -> [1, ..., 4]\n") == "pass"
    assert status("python", "undefined_name\n") == "fail"
    assert status("text", ">>> 1 + 1\n2\n") == "pass"
    assert status("text", ">>> 1 + 1\n3\n") == "fail"
    assert status("text", "$ echo hi\nhi\n") == "pass"
    assert status("text", "$ echo hi\nho\n") == "fail"
    assert status("bash", "false\n") == "fail"
    assert status("bash", "python3 dev.py test\n") == "fail"  # refused: would recurse
    assert status("text", "just words\n") == "skip"
