"""Locate the shared IOPDDL instances: ``../shared`` beside the checkout, then
``$XLA_DTENSOR_SHARED``, then ``/work/shared``; tests skip with the reason if none has them."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

_REPO = Path(__file__).resolve().parents[2]


def iopddl_dir() -> Path | None:
    candidates = [_REPO / ".." / "shared"]
    if os.environ.get("XLA_DTENSOR_SHARED"):
        candidates.append(Path(os.environ["XLA_DTENSOR_SHARED"]))
    candidates.append(Path("/work/shared"))
    for root in candidates:
        d = root / "data" / "iopddl"
        if (d / "example.json").exists():
            return d.resolve()
    return None


def iopddl_file(name: str) -> Path:
    """Path of a shared instance file, or skip the test saying where it looked."""
    d = iopddl_dir()
    if d is None or not (d / name).exists():
        pytest.skip(f"IOPDDL data {name!r} not found in ../shared/data/iopddl beside the repo, "
                    "$XLA_DTENSOR_SHARED/data/iopddl or /work/shared/data/iopddl")
    return d / name
