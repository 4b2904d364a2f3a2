"""The solver package is torch-free: it imports nothing above it (issue 39).

Oracle: a fresh interpreter in which ``import torch`` (and jax, xla_dtensor) fails, and
the package's own import statements read from its source.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autoshard" / "solver"
BLOCKED = ("torch", "jax", "jaxlib", "xla_dtensor")

_CHILD = f"""
import importlib.abc, pkgutil, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ImportError(f"blocked: {{name}}")
        return None

sys.meta_path.insert(0, Block())
import autoshard.solver
for info in pkgutil.iter_modules(autoshard.solver.__path__):
    importlib.import_module("autoshard.solver." + info.name)
above = sorted(m for m in sys.modules if m.startswith("autoshard.") and not m.startswith("autoshard.solver"))
print("OK", len(sys.modules), above)
"""


def test_solver_imports_without_torch():
    proc = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK") and proc.stdout.rstrip().endswith("[]"), proc.stdout


def _imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_solver_sources_import_nothing_above_them():
    """Lazy imports inside functions count too: only the package itself, numpy, scipy,
    ortools, the standard library and mesh's argument parsing (the CLI)."""
    bad = {}
    for path in sorted(PACKAGE.glob("*.py")):
        above = {m for m in _imported(path)
                 if m.split(".")[0] in BLOCKED + ("rich", "networkx")
                 or (m.startswith("autoshard") and not m.startswith("autoshard.solver"))
                 or (m.startswith("mesh") and m != "mesh._cli")}
        if above:
            bad[path.name] = sorted(above)
    assert not bad, bad
