"""Persistent compile cache across processes, execution analysis, reports, HLO dumps."""
from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.debug import analysis

from tests import _parallel

_ROOT = Path(__file__).resolve().parents[3]
_CHILD = textwrap.dedent("""
    import json, sys
    import xla_dtensor, torch
    from xla_dtensor import metrics
    assert xla_dtensor.runtime.initialize_cache(sys.argv[1])
    step = xla_dtensor.compile(lambda w, x: (w.add_(x @ x.T.sum(1, keepdim=True).expand(-1, 3))).tanh().sum())
    dev = xla_dtensor.device()
    w = torch.ones(3, 3, device=dev)
    out = [step(w, torch.arange(9.0).reshape(3, 3).to(dev) / 10).item() for _ in range(3)]
    c = metrics.counters()
    print(json.dumps({"out": out, "xla": c["xla_compiles"], "hits": c["persistent_cache_hits"],
                      "compiles": c["compiles"]}))
""")


def _child(cache: Path) -> dict:
    env = _parallel.child_env(dict(os.environ, PYTHONPATH=str(_ROOT), XLA_DTENSOR_DEBUG="0"), __name__)
    r = _parallel.run([sys.executable, "-c", _CHILD, str(cache)], env=env, timeout=300, cwd=_ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def _two_children() -> tuple[dict, dict]:
    """Two fresh processes, one after the other, sharing a new compile cache."""
    cache = _parallel.scratch("compile_cache") / "cache"
    return _child(cache), _child(cache)


def start_early(session: pytest.Session) -> None:
    """The two processes of the first test start when collection ends, in the background (tests/_parallel.py)."""
    if any(getattr(item, "module", None) is sys.modules[__name__]
           and item.name == "test_second_process_skips_xla_compilation" for item in session.items):
        _parallel.start_early(__name__, _two_children)


def test_second_process_skips_xla_compilation():
    first, second = _parallel.early(__name__, _two_children)
    assert first["xla"] >= 1 and first["hits"] == 0, first
    assert second["xla"] == 0, second
    assert second["hits"] == first["xla"], (first, second)
    w, x = np.ones((3, 3)), np.arange(9.0).reshape(3, 3) / 10
    expect = []
    for _ in range(3):
        w = w + np.broadcast_to((x @ x.T).sum(1, keepdims=True), (3, 3))
        expect.append(np.tanh(w).sum())
    np.testing.assert_allclose(second["out"], expect, rtol=1e-5)
    assert first["out"] == second["out"]


def test_unusable_cache_dir_warns_and_runs_uncached(tmp_path, dev):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.warns(xla_dtensor.runtime.CacheWarning, match="not a directory"):
        assert xla_dtensor.runtime.initialize_cache(blocker) is False
    with pytest.warns(xla_dtensor.runtime.CacheWarning, match="not a readable directory"):
        assert xla_dtensor.runtime.initialize_cache(tmp_path / "missing", readonly=True) is False
    assert (torch.ones(2, device=dev) * 5).sum().item() == 10.0
    with pytest.raises(TypeError, match="got int"):
        xla_dtensor.runtime.initialize_cache(3)


@pytest.fixture
def debug_on():
    analysis.set_debug(True)
    yield
    analysis.set_debug(False)


def test_lazy_recompile_line_names_the_changed_input(dev, capsys, debug_on):
    for n in (2, 4):
        x = torch.ones(n, 3).to(dev)
        (x * 7.5).sum().item()  # same line, new shape: a recompile
    for n in (2, 4):
        torch.full((n,), 2.0, device=dev).sum().item()  # a new shape inside the graph, not in an input
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[xla_dtensor] compile")]
    assert len(lines) == 4, err
    assert "cause=.item()" in lines[1] and "test_runtime_analysis.py" in lines[1]
    assert "recompile: input 0 changed: float32[2, 3] -> float32[4, 3]" in lines[1], lines[1]
    assert "inputs=2 outputs=1" in lines[1]  # x and the Python scalar 7.5; one output
    assert "has new arguments: (((<class 'int'>, 2),)" in lines[3], lines[3]  # the size argument 2 -> 4
    assert "-> (((<class 'int'>, 4),)" in lines[3], lines[3]


def test_compile_call_recompile_names_the_argument(dev, capsys, debug_on):
    f = xla_dtensor.compile(lambda x: x.exp())
    f(torch.ones(2, device=dev))
    f(torch.ones(5, device=dev))
    f(torch.ones(5, device=dev))
    err = capsys.readouterr().err
    assert "new input signature: argument 0: tensor float32[2] -> tensor float32[5]" in err, err
    assert "[xla_dtensor] execute: cause=compile call (replay)" in err


def test_recompile_warning_after_limit(dev):
    old = xla_dtensor.config.recompile_warn_limit
    xla_dtensor.config.recompile_warn_limit = 2
    try:
        with pytest.warns(analysis.RecompileWarning, match="compiled 3 different programs"):
            for n in range(1, 4):
                (torch.ones(n, device=dev) + 0.5).sum().item()
    finally:
        xla_dtensor.config.recompile_warn_limit = old


def test_reports_and_hlo_dumps(dev):
    x = torch.arange(6.0).reshape(2, 3).to(dev)
    y = (x * 3).sum(1)
    sh = xla_dtensor.get_stablehlo([y])
    assert sh.startswith("module") and "stablehlo.multiply" in sh and "stablehlo.reduce" in sh
    hlo = xla_dtensor.get_hlo(y)
    assert "HloModule" in hlo and "multiply" in hlo
    before = metrics.snapshot()
    opt_hlo = xla_dtensor.get_hlo([y], optimized=True)
    assert "HloModule" in opt_hlo and metrics.diff(before)["executions"] == 0
    assert y.tolist() == [9.0, 36.0]  # dumping ran nothing; the value is still right
    rep = xla_dtensor.metrics_report()
    assert "compiles" in rep and "p50=" in rep
    assert "xla_compiles" in xla_dtensor.short_metrics_report()
    with pytest.raises(TypeError, match="expected tensors on the jax device, got Tensor"):
        xla_dtensor.get_hlo([torch.ones(2)])
