"""The environment a user has after the README's quick start: the installed packages only.

``pip install -e .`` ships ``xla_dtensor``, ``autoshard`` and ``mesh`` (pyproject.toml),
so a user's scripts can import those and nothing else of the checkout (not
``benchmarks``, not ``tests``). :func:`user_env` strips ``PYTHONPATH``; when the
installed packages belong to another checkout (a git worktree sharing one virtual
environment), the child sees this checkout's shipped packages through a folder of
links to them, and still nothing else.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ("xla_dtensor", "autoshard", "mesh")  # pyproject.toml [tool.setuptools.packages.find]


def _installed_here(env: dict[str, str]) -> bool:
    probe = "import importlib.util as u; print(u.find_spec('xla_dtensor').origin)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd="/", env=env,
                         timeout=60).stdout.strip()
    return out.startswith(str(ROOT))


def user_env(scratch: Path) -> dict[str, str]:
    """``os.environ`` without ``PYTHONPATH``/``XLA_FLAGS``, plus links in ``scratch`` if needed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
    if not _installed_here(env):
        for name in SHIPPED:
            link = scratch / name
            if not link.exists():
                link.symlink_to(ROOT / name)
        env["PYTHONPATH"] = str(scratch)
    return env
