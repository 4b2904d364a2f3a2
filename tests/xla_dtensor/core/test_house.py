"""The core owns its state and its tensors' fields: checks on the source tree (issue on lazy speed).

* No flag cells (``NAME = [False]`` module lists flipped from outside) in the core and no
  swapped dispatch function: the switches live on ``core.state.STATE``.
* Outside the core, no module reads a tensor's private fields (``_storage``, ``_chain``,
  ``_meta``, ``_vcache``, ``_seen``) or a private name of a core module; they use the
  accessors (``storage_of``, ``meta_of``, ``is_view``, ...).
* The core imports neither ``xla_dtensor.checkpoint`` nor ``xla_dtensor.eager``.
"""
from __future__ import annotations

import ast
import pathlib
import re

import pytest

PKG = pathlib.Path(__file__).resolve().parents[3] / "xla_dtensor"
CORE = PKG / "core"
OUTSIDE = sorted(p for p in PKG.rglob("*.py") if CORE not in p.parents)
FIELDS = {"_storage", "_chain", "_meta", "_vcache", "_seen"}
CORE_MODULES = {p.stem for p in CORE.glob("*.py")} - {"__init__"}


def _tree(path: pathlib.Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _flag_cells(path: pathlib.Path) -> list[str]:
    """Module-level ``NAME = [scalar]`` assignments: one-element lists used as mutable flags."""
    found = []
    for node in _tree(path).body:
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.List) and len(value.elts) == 1 and isinstance(value.elts[0], ast.Constant):
            found.append(f"{path.name}:{node.lineno}")
    return found


def _private_reads(path: pathlib.Path) -> list[str]:
    """Tensor private fields read or written, and private names of core modules used or imported."""
    bad = []
    own_fields = path.name == "hidden.py"  # jit/hidden.py's own class has a ``_seen`` dict
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and node.attr in FIELDS and not own_fields:
            bad.append(f"{path.name}:{node.lineno} .{node.attr}")
        elif (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
              and isinstance(node.value, ast.Name) and node.value.id in CORE_MODULES):
            bad.append(f"{path.name}:{node.lineno} {node.value.id}.{node.attr}")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("xla_dtensor.core"):
            bad += [f"{path.name}:{node.lineno} import {a.name}" for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")]
    return bad


def test_the_core_has_no_flag_cells():
    cells = [c for p in sorted(CORE.glob("*.py")) for c in _flag_cells(p)]
    assert cells == [], f"one-element module lists used as flags (put them on core.state.STATE): {cells}"


def test_the_flag_cell_check_finds_one(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("CAPTURING = [False]\nLIMIT = [1, 2]\n")
    assert _flag_cells(probe) == ["probe.py:1"]


def test_nothing_swaps_the_cores_functions():
    """Eager mode and debugging are states and hooks (``core.state``, ``executor.ON_EXECUTE``),
    not replaced functions."""
    swaps = [f"{p.relative_to(PKG)}:{i + 1}" for p in PKG.rglob("*.py")
             for i, line in enumerate(p.read_text().splitlines())
             if re.search(r"\b(dispatch|_dispatch_mod|executor)\.(dispatch|record|execute|sync)\s*=[^=]", line)]
    assert swaps == []


@pytest.mark.parametrize("folder", ["spmd", "jit", "checkpoint", "debug", "auto", "compat"])
def test_no_private_core_names_outside_the_core(folder):
    files = [p for p in OUTSIDE if folder in p.relative_to(PKG).parts[:1]]
    if folder != "compat":
        assert files, folder
    bad = [b for p in files for b in _private_reads(p)]
    assert bad == [], f"use the core's accessors (core.tensor.storage_of, meta_of, is_view, ...): {bad}"


def test_top_level_modules_use_the_accessors_too():
    bad = [b for p in OUTSIDE if p.parent == PKG for b in _private_reads(p)]
    assert bad == []


def test_the_private_read_check_finds_them(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from xla_dtensor.core.tensor import _new\nx = t._storage.value\ny = executor._plan(r)\n")
    assert _private_reads(probe) == ["probe.py:1 import _new", "probe.py:2 ._storage", "probe.py:3 executor._plan"]


def test_the_core_imports_no_checkpoint_or_eager():
    bad = []
    for p in sorted(CORE.glob("*.py")):
        for node in ast.walk(_tree(p)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            bad += [f"{p.name}:{node.lineno} {n}" for n in names
                    if n.startswith(("xla_dtensor.checkpoint", "xla_dtensor.eager"))]
    assert bad == []
