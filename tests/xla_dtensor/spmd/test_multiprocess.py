"""Two processes (4 CPU devices each, gloo): DP over DCN x TP over ICI equals one-process training."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests import _parallel

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "examples", "multiprocess_hybrid.py")


def _example():
    spec = importlib.util.spec_from_file_location("multiprocess_hybrid", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run() -> tuple[subprocess.CompletedProcess, Path]:
    out = _parallel.scratch("multiprocess")
    env = _parallel.child_env(dict(os.environ), __name__)
    return _parallel.run([sys.executable, EXAMPLE, "--out", str(out)], env=env, timeout=150), out


def start_early(session: pytest.Session) -> None:
    """The two processes start when collection ends, in the background (tests/_parallel.py)."""
    _parallel.start_early(__name__, _run)


def test_two_processes_hybrid_mesh_match_single_process_reference():
    ex = _example()
    proc, out = _parallel.early(__name__, _run)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    results = [torch.load(out / f"result{i}.pt") for i in range(2)]
    # single-process CPU reference (independent oracle): same model, data and optimizer
    model, data = ex.make_model_and_data()
    opt = torch.optim.SGD(model.parameters(), lr=ex.LR)
    ref_losses = []
    for x, y in data:
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        ref_losses.append(loss.item())
    for r in results:
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(ref_losses), rtol=1e-5, atol=1e-6)
        for name, p in model.named_parameters():
            torch.testing.assert_close(r["params"][name], p.detach(), rtol=1e-5, atol=1e-6)
    for name in results[0]["params"]:
        assert torch.equal(results[0]["params"][name], results[1]["params"][name]), name
