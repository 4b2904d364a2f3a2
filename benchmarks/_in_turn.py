"""Shared pieces of the benchmarks that time training steps and run cases in turn: the parts of a step, a case
process's step loop, and results files of labelled sections.

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
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable


def serve(step: Callable[[], dict]) -> None:
    """A case process's loop: ``ready``, then ``step()``'s figures on a line per ``step`` line read."""
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "step":
            break
        print(json.dumps(step()), flush=True)


def step_in_turn(procs: dict[str, Any], rounds: int, warmup: int = 3, progress: bool = False) -> dict[str, list[dict]]:
    """Each case process (:func:`serve`'s, by name) stepped once per round in turn, ``warmup`` rounds first: the
    figures of each case's steps after the warm-up, by name."""
    got: dict[str, list[dict]] = {name: [] for name in procs}
    for i in range(warmup + rounds):
        for name, proc in procs.items():
            proc.stdin.write("step\n")
            proc.stdin.flush()
            step = json.loads(proc.stdout.readline())
            if i >= warmup:
                got[name].append(step)
        if progress:
            print(f"round {i + 1}/{warmup + rounds}", file=sys.stderr, flush=True)
    return got


def step_parts(model: Any, opt: Any, batch: tuple, steps: int, sync: Callable[[], None] | None = None,
               clock: Callable[[], float] = time.thread_time) -> dict[str, float]:
    """Medians (ms) of each part of ``steps`` training steps: the CPU time (``clock``) of the forward
    (``model(*batch)``, the loss), the backward, the optimizer step (with ``zero_grad``) and ``sync``."""
    parts: dict[str, list[float]] = {"forward": [], "backward": [], "optimizer": [], "sync": []}
    for _ in range(steps):
        c0 = clock()
        loss = model(*batch)
        c1 = clock()
        loss.backward()
        c2 = clock()
        opt.step()
        opt.zero_grad(set_to_none=True)
        c3 = clock()
        if sync is not None:
            sync()
        c4 = clock()
        for k, v in zip(parts, (c1 - c0, c2 - c1, c3 - c2, c4 - c3)):
            parts[k].append(1e3 * v)
    return {k: statistics.median(v) for k, v in parts.items()}


def save_section(md: Path, head: str, label: str, section: str) -> None:
    """Write ``section`` under ``label`` into the results file ``md`` (``head`` first), keeping other labels'."""
    md.parent.mkdir(exist_ok=True)
    sections = dict(re.findall(r"(?ms)^<!-- (.+?) -->\n(.*?)(?=^<!-- |\Z)", md.read_text())) if md.exists() else {}
    sections[label] = section + "\n"
    md.write_text(head + "".join(f"<!-- {k} -->\n{v}" for k, v in sections.items()))
