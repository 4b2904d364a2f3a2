"""The README's demo runs (``python -m xla_dtensor.demo --quick``) and its figures are right.

Oracles: the first training loss the demo prints equals torch CPU eager's loss of the
same seeded model on the same batch (the sharding must not change the math); the plan
the demo explains has the mesh it was asked for.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest
import torch

from tests import _parallel

ROOT = Path(__file__).resolve().parents[2]


def _demo() -> str:
    env = _parallel.child_env(dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="160"), __name__)
    proc = _parallel.run([sys.executable, "-m", "xla_dtensor.demo", "--quick"], cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def start_early(session: pytest.Session) -> None:
    """The demo starts when collection ends, in the background (tests/_parallel.py)."""
    _parallel.start_early(__name__, _demo)


@pytest.fixture(scope="module")
def demo_output() -> str:
    return _parallel.early(__name__, _demo)


def test_demo_sections(demo_output: str) -> None:
    for line in ("8 JAX devices on platform 'cpu'", "autoshard plan: mesh data=2 x model=4",
                 "A few parameters' layouts", "AUTO vs manual strategies", "data_parallel", "fsdp",
                 "One layout, four spellings", "demo finished"):
        assert line in demo_output, f"missing {line!r} in demo output:\n{demo_output[-2000:]}"
    assert "{devices=[" in demo_output  # a visualized parameter layout


def test_demo_loss_matches_cpu(demo_output: str) -> None:
    from xla_dtensor.demo import SIZES, demo_batch, demo_model

    size = SIZES["quick"]
    with torch.no_grad():
        ref = float(demo_model(size)(*demo_batch(size)))
    losses = [float(x) for x in re.search(r"AUTO losses: ([\d. ]+)", demo_output).group(1).split()]
    assert len(losses) == size.steps
    assert losses[0] == pytest.approx(ref, rel=1e-4)
    assert losses[-1] < losses[0]  # AdamW on one fixed batch: the loss goes down
