"""Every runnable example under docs/examples runs and checks itself (multiprocess: test_multiprocess)."""
from __future__ import annotations

import os
import runpy

import pytest

HERE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "examples")
EXAMPLES = sorted(f for f in os.listdir(HERE) if f.endswith(".py") and f != "multiprocess_hybrid.py")


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_runs(name, capsys):
    runpy.run_path(os.path.join(HERE, name), run_name="__main__")
    assert "ok" in capsys.readouterr().out
