"""Shared pieces of the benchmarks that run cases in turn: a case process's step loop, and results files of
labelled sections.

A case process prints ``ready``, then runs one step per ``step`` line on stdin and prints that step's figures
as one JSON line; any other line ends it (:func:`serve`). A results file keeps one section per label, a run
replacing its own label's section and keeping the others (:func:`save_section`).

Example:
    >>> import tempfile
    >>> md = Path(tempfile.mkdtemp()) / "r.md"
    >>> save_section(md, "# r\\n\\n", "a", "one"); save_section(md, "# r\\n\\n", "b", "two")
    >>> save_section(md, "# r\\n\\n", "a", "three"); md.read_text()
    '# r\\n\\n<!-- a -->\\nthree\\n<!-- b -->\\ntwo\\n'
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Callable


def serve(step: Callable[[], dict]) -> None:
    """A case process's loop: ``ready``, then ``step()``'s figures on a line per ``step`` line read."""
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps(step()), flush=True)


def save_section(md: Path, head: str, label: str, section: str) -> None:
    """Write ``section`` under ``label`` into the results file ``md`` (``head`` first), keeping other labels'."""
    md.parent.mkdir(exist_ok=True)
    sections = dict(re.findall(r"(?ms)^<!-- (.+?) -->\n(.*?)(?=^<!-- |\Z)", md.read_text())) if md.exists() else {}
    sections[label] = section + "\n"
    md.write_text(head + "".join(f"<!-- {k} -->\n{v}" for k, v in sections.items()))
