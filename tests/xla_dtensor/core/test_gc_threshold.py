"""``config.gc_threshold``: Python's young-generation threshold while the library is loaded."""
from __future__ import annotations

import gc

import pytest
import torch

import xla_dtensor
from xla_dtensor import config


@pytest.fixture
def restore():
    before = config.gc_threshold
    yield
    config.gc_threshold = before


def _young_collections(steps) -> int:
    counted = [0]

    def cb(phase: str, info: dict) -> None:
        if phase == "start" and info["generation"] == 0:
            counted[0] += 1
    gc.collect()
    gc.callbacks.append(cb)
    try:
        steps()
    finally:
        gc.callbacks.remove(cb)
    return counted[0]


def _lazy_steps(dev, steps: int = 6) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(12)]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randn(4, 8).to(dev)
    for _ in range(steps):
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()


def test_default_raises_the_young_threshold_and_none_restores_it(restore):
    config.gc_threshold = None
    python_default = gc.get_threshold()[0]
    config.gc_threshold = 20_000
    assert gc.get_threshold()[0] == max(20_000, python_default)
    config.gc_threshold = None
    assert gc.get_threshold()[0] == python_default


def test_bad_values_are_refused_and_change_nothing(restore):
    before = (config.gc_threshold, gc.get_threshold())
    for bad in (0, -5, 1.5, True, "20000"):
        with pytest.raises(ValueError, match="gc_threshold must be a positive int or None"):
            config.gc_threshold = bad
    assert (config.gc_threshold, gc.get_threshold()) == before


def test_lazy_steps_run_fewer_young_collections(dev, restore):
    _lazy_steps(dev, 1)  # compile first: the comparison is of cached steps
    config.gc_threshold = None
    if gc.get_threshold()[0] >= 5000:
        pytest.skip("Python's own young threshold is already high")
    at_python = _young_collections(lambda: _lazy_steps(dev))
    config.gc_threshold = 20_000
    raised = _young_collections(lambda: _lazy_steps(dev))
    assert at_python >= 5 and raised * 5 <= at_python, (at_python, raised)
