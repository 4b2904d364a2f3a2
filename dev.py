#!/usr/bin/env python3
"""One-command setup for development: ``python3 dev.py demo`` or ``python3 dev.py test``.

Creates ``.venv`` beside this file (once), installs the package in editable mode with
the pinned development dependencies from ``constraints-dev.txt`` (torch==2.13.0 CPU,
jax 0.10.x), then runs the demo or the test suite. Re-installs only when
``pyproject.toml`` or the constraints change. Extra arguments go to the command:
``python3 dev.py test -k mesh``.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
STAMP = VENV / ".xla-dtensor-installed"
PY = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
COMMANDS = {
    "demo": ["-m", "xla_dtensor.demo"],
    "test": ["-m", "pytest"],
    "setup": None,
}


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for name in ("pyproject.toml", "constraints-dev.txt", "setup.py", "xla_dtensor/core/_native.c",
                 "xla_dtensor/core/_cxx.cpp"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def _run(args: list[str]) -> None:
    print("+", " ".join(args), flush=True)
    subprocess.run(args, check=True, cwd=ROOT)


def setup() -> None:
    """Create the virtual environment and install pinned dependencies if stale."""
    if sys.version_info < (3, 10):
        sys.exit(f"dev.py needs Python >= 3.10, found {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating virtual environment in {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if STAMP.exists() and STAMP.read_text() == _fingerprint():
        return
    pip = [str(PY), "-m", "pip", "install", "--disable-pip-version-check"]
    # torch first and pinned: an unpinned torch would pull several GB of CUDA wheels.
    _run(pip + ["-c", "constraints-dev.txt", "torch"])
    _run(pip + ["-c", "constraints-dev.txt", "-e", ".[dev,bench,models]"])
    # the core's C++ part links against the torch just installed: built now, not by the first import
    _run([str(PY), "-c", "from xla_dtensor.core import cxx; print(cxx.MODULE or cxx.REASON)"])
    STAMP.write_text(_fingerprint())


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print(f"usage: python3 dev.py {{{'|'.join(COMMANDS)}}} [args...]", file=sys.stderr)
        return 2
    setup()
    tail = COMMANDS[argv[0]]
    if tail is None:
        return 0
    return subprocess.run([str(PY), *tail, *argv[1:]], cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
