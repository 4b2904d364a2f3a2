"""Backward on the jax device works whatever ran before ``import xla_dtensor`` (issue 25).

torch's autograd engine sizes its per-device queues at the first backward of the process,
so each case runs in a fresh interpreter. The oracle is torch CPU autograd on the same
model, computed in the same process.
"""
from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests import _parallel
from tests._parallel import Results, selected, selected_in

ROOT = Path(__file__).resolve().parents[3]

# Shared tail of every case: a 2-layer MLP's gradients on the jax device, sharded
# data-parallel over the 8 virtual devices, against the same step on torch CPU.
_CHECK = """
import threading, warnings
import torch
from torch import nn

def grads(model, x):
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad for p in model.parameters()]

torch.manual_seed(0)
cpu_model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
x = torch.randn(16, 8)
want = grads(cpu_model, x)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import xla_dtensor
    from xla_dtensor.core import AutogradEngineWarning
names = [type(w.message).__name__ for w in caught if issubclass(w.category, AutogradEngineWarning)]
print("WARNINGS", names)
mesh = xla_dtensor.Mesh(range(8), (8,), ("data",))
dev = xla_dtensor.device()
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))
model.load_state_dict(cpu_model.state_dict())
model.to(dev)
xd = x.to(dev)
xla_dtensor.mark_sharding(xd, mesh, ("data", None))
got = grads(model, xd)
for g, w in zip(got, want):
    torch.testing.assert_close(g.cpu(), w)
print("MAIN OK")

def other_thread():
    try:
        with torch.autograd.set_multithreading_enabled(False):  # what the warning tells users
            got = grads(model, xd)
        torch.testing.assert_close(got[0].cpu(), want[0])
        print("THREAD OK")
    except Exception as err:  # noqa: BLE001
        print("THREAD FAILED", type(err).__name__, err)

def unwrapped_thread():  # its first op on the device switches its backward (xla_dtensor.core.device)
    try:
        got = grads(model, xd)
        torch.testing.assert_close(got[0].cpu(), want[0])
        print("THREAD2 OK")
    except Exception as err:  # noqa: BLE001
        print("THREAD2 FAILED", type(err).__name__, err)

for target in (other_thread, unwrapped_thread):
    t = threading.Thread(target=target)
    t.start()
    t.join()
"""

_CASES = {
    # nothing before the import: the normal order
    "import_first": "import xla_dtensor\n",
    # a CPU reference first (the engine starts without the jax device)
    "cpu_backward_first": """
        import torch
        w = torch.randn(3, requires_grad=True)
        (w * 2).sum().backward()
        assert torch.equal(w.grad, torch.full((3,), 2.0))
    """,
    # autoshard's tracer first (it runs torch.autograd.grad under FakeTensorMode)
    "autoshard_trace_first": """
        import torch
        from torch import nn
        from autoshard import trace_training_step

        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(8, 4)

            def forward(self, x):
                return self.fc(x).square().mean()

        graph = trace_training_step(Net(), (torch.randn(16, 8),))
        assert len(graph.nodes) > 0
    """,
}


def _run(prelude: str, env: dict[str, str]) -> str:
    code = textwrap.dedent(prelude) + _CHECK
    proc = _parallel.run([sys.executable, "-c", code], cwd=ROOT, env=env, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "INTERNAL ASSERT" not in proc.stderr
    return proc.stdout


def _outputs(cases: list[str]) -> Results:
    """Each case's fresh process, two at a time (on a 2-core machine: half the wall time)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env = _parallel.child_env(dict(env, PYTHONPATH=str(ROOT)), __name__)
    return Results(lambda case: _run(_CASES[case], env), cases)


def start_early(session: pytest.Session) -> None:
    """The selected cases start when collection ends, in the background (tests/_parallel.py)."""
    cases = selected_in(session, sys.modules[__name__], "case")
    _parallel.start_early(__name__, lambda: _outputs(cases))


@pytest.fixture(scope="module")
def outputs(request) -> Results:
    return _parallel.early(__name__, lambda: _outputs(selected(request, "case")))


@pytest.mark.parametrize("case", sorted(_CASES))
def test_backward_on_device_after(case, outputs):
    out = outputs[case]
    assert "MAIN OK" in out and "THREAD OK" in out and "THREAD2 OK" in out, out
    warned = "AutogradEngineWarning" in out.split("WARNINGS", 1)[1].splitlines()[0]
    # the warning appears exactly when a backward ran before the import
    assert warned == (case != "import_first"), out

