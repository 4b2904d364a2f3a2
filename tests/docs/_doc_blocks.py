"""Find the code blocks of README.md and docs/*.md and say how each is run (docs/README.md).

A block is one fenced block (backticks or tildes, CommonMark rules). An HTML comment
on the line just before the fence marks it: ``<!-- docs-test: slow -->`` or
``<!-- docs-test: skip REASON -->``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = {"python", "py", "python3", "pycon"}
SHELL = {"bash", "sh", "shell", "console"}
TEXT = {"text", "output", "json", "toml", "yaml", "diff", "markdown", "md", "html", "ini", "csv"}
_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
_MARK = re.compile(r"^\s*<!--\s*docs-test:\s*(\w[\w-]*)\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    page: str          # path relative to the repository root
    line: int          # 1-based line of the opening fence
    lang: str          # the info string's first word, lower case ("" when missing)
    text: str
    mark: str = ""     # "", "slow" or "skip"
    reason: str = ""   # a skip's reason; an unknown mark's name
    output: str | None = None  # the ```output block right after a python block, if any

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def kind(self) -> str:
        """doctest | console | python | shell | text | unlabelled."""
        lines = [ln for ln in self.text.splitlines() if ln.strip()]
        if any(ln.lstrip().startswith(">>> ") or ln.strip() == ">>>" for ln in lines):
            return "doctest"
        if lines and lines[0].startswith("$ "):
            return "console"
        if self.lang in PYTHON:
            return "python"
        if self.lang in SHELL:
            return "shell"
        return "text" if self.lang else "unlabelled"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def parse(path: Path) -> list[Block]:
    """Every fenced block of one markdown file, in order."""
    rel = str(path.relative_to(ROOT))
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        mark = _MARK.match(lines[i - 1]) if i else None
        body, j = [], i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and set(close) == {fence[0]}:
                break
            line = lines[j]
            body.append(line[indent:] if indent and line[:indent].isspace() else line if not indent else line.lstrip())
            j += 1
        blocks.append(Block(rel, i + 1, lang, "\n".join(body) + "\n",
                            mark.group(1) if mark else "", mark.group(2) if mark else ""))
        i = j + 1
    return _attach_outputs(blocks)


def _attach_outputs(blocks: list[Block]) -> list[Block]:
    out: list[Block] = []
    for b in blocks:
        if b.lang == "output" and out and out[-1].kind == "python":
            prev = out.pop()
            out.append(Block(prev.page, prev.line, prev.lang, prev.text, prev.mark, prev.reason, b.text))
        out.append(b)
    return out


def all_blocks() -> list[Block]:
    return [b for p in pages() for b in parse(p)]
