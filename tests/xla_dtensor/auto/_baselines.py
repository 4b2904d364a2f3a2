"""Manual baselines completed greedily, for tests that read neither ``plan.baselines`` nor the guard.

Each manual baseline (DP, FSDP, Megatron, 2-D) is by default a solve with its parameters pinned,
up to ``autoshard.baselines.COMPLETE_TIME_LIMIT`` seconds each (11-13 s for the four on a small
GPT-2 here); ``autoshard.baselines.complete(..., time_limit=None)`` completes them greedily instead.
The baselines only warm-start the plan's solve and fill ``plan.baselines`` (the explanation's table,
the plan-quality guard), so a test that asserts on neither can skip those solves.

Example::

    with greedy_baselines():
        plan = autoshard.solve(graph, mesh)   # plan.baselines: greedy completions
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator

import pytest

import autoshard.baselines
import autoshard.layered


@contextlib.contextmanager
def greedy_baselines() -> Iterator[None]:
    """Within the block, every solve completes its manual baselines greedily (``time_limit=None``)."""
    greedy = functools.partial(autoshard.baselines.complete, time_limit=None)
    with pytest.MonkeyPatch.context() as mp:
        for module in (autoshard.baselines, autoshard.layered):  # layered imports the name itself
            mp.setattr(module, "complete", greedy)
        yield
