"""compile and hidden Python state: globals and closure values the function reads are in its signature."""
from __future__ import annotations

import warnings

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.jit import GraphChangedWarning, HiddenStateWarning
from xla_dtensor.jit.args import describe_change, signature
from xla_dtensor.jit.hidden import Hidden

SCALE = 2.0
BIG = {f"k{i}": i for i in range(100)}


def _scaled(x):
    return x * SCALE + 1


def test_a_global_scalar_changed_between_calls_is_never_replayed_stale(dev):
    """The issue's probe: a global changed between calls gave wrong results in 9 of 12 calls."""
    global SCALE
    f = xla_dtensor.compile(_scaled)
    x = torch.arange(4.0)
    values = [2.0, 2.0, 3.0, 3.0, 3.0, 0.5, 2.0, 2.0, 3.0, 7.0, 7.0, 2.0]
    before = metrics.snapshot()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GraphChangedWarning)
            for v in values:
                SCALE = v
                torch.testing.assert_close(f(x.to(dev)).cpu(), x * v + 1)
    finally:
        SCALE = 2.0
    d = metrics.diff(before)
    assert d["compile_traces"] == len(set(values)), d  # one program per value, reused when it comes back
    assert d["compile_replays"] == len(values) - len(set(values)), d


def test_a_closure_dict_and_list_are_watched(dev):
    cfg = {"add": False, "k": 2}
    offsets = [1.0]

    @xla_dtensor.compile
    def f(x):
        y = x + cfg["k"] if cfg["add"] else x * cfg["k"]
        return y + offsets[0]

    x = torch.ones(3)
    for add, k, off in [(False, 2, 1.0), (False, 2, 1.0), (True, 2, 1.0), (True, 5, 1.0), (True, 5, -1.0)]:
        cfg["add"], cfg["k"], offsets[0] = add, k, off
        torch.testing.assert_close(f(x.to(dev)).cpu(), (x + k if add else x * k) + off)


def test_a_container_it_cannot_watch_warns_once_naming_it(dev):
    @xla_dtensor.compile
    def f(x):
        return x * BIG["k3"]

    with pytest.warns(HiddenStateWarning,
                      match=r"reads global 'BIG', a dict that compile cannot watch \(more than 64 items"):
        assert f(torch.ones(2).to(dev)).tolist() == [3.0, 3.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", HiddenStateWarning)
        f(torch.ones(2).to(dev))


def test_the_retrace_reason_names_the_variable_and_both_values():
    cell = {"lr": 0.1}

    def f(x):
        return x * cell["lr"] * SCALE

    h = Hidden(f)
    old = signature((1,), {}, [], h.key())
    cell["lr"] = 0.2
    new = signature((1,), {}, [], h.key())
    assert describe_change(old, new) == "global or closure variable 'cell': {'lr': 0.1} -> {'lr': 0.2}"


def test_modules_functions_and_tensors_are_not_watched():
    w = torch.ones(2)

    def f(x):
        return torch.nn.functional.relu(x @ w) + len(x)

    assert Hidden(f).key() == ()


@pytest.mark.filterwarnings("ignore::xla_dtensor.debug.analysis.RecompileWarning")  # a compile per value
def test_a_global_that_keeps_changing_warns_once(dev):
    global SCALE
    f = xla_dtensor.compile(_scaled)
    x = torch.ones(2)
    try:
        with pytest.warns(HiddenStateWarning, match=r"has seen 8 values of global 'SCALE'"):
            for v in range(10, 19):
                SCALE = float(v)
                assert f(x.to(dev)).tolist() == [v + 1.0] * 2
    finally:
        SCALE = 2.0
