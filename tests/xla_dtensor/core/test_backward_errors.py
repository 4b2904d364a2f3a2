"""An error in an op run by torch's C++ autograd engine surfaces as itself, never aborts.

Each case runs in a subprocess, so a process abort (the failure mode being guarded
against: std::terminate inside torch's engine) fails the test instead of pytest.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = textwrap.dedent("""
    import torch, xla_dtensor
    from xla_dtensor.core import dispatch
    from xla_dtensor.ops import registry
    dev = xla_dtensor.device()
    cos = torch.ops.aten.cos.default
    good = registry._LOWERINGS[cos]

    def bad(*args, **kwargs):
        raise RuntimeError("lowering failed on purpose")

    x_cpu = torch.randn(3, 3)
    x = x_cpu.to(dev).requires_grad_()
    registry._LOWERINGS[cos] = bad          # sin's backward calls cos: only backward fails
    dispatch._ENTRIES.clear()
    y = (x * 2).sin().sum()
    try:
        y.backward()
    except RuntimeError as e:
        print("RAISED:", e)
    registry._LOWERINGS[cos] = good
    dispatch._ENTRIES.clear()
    x.grad = None
    xla_dtensor.sync()                      # nothing poisoned blocks later steps
    (x * 2).sin().sum().backward()
    ref = x_cpu.clone().requires_grad_()
    (ref * 2).sin().sum().backward()
    print("GRAD_OK:", torch.allclose(x.grad.cpu(), ref.grad, atol=1e-6))
""")


def test_backward_lowering_error_is_raised_by_backward_and_device_stays_usable():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env=None)
    assert proc.returncode == 0, f"subprocess died (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    assert "RAISED: lowering failed on purpose" in proc.stdout, proc.stdout + proc.stderr[-2000:]
    assert "GRAD_OK: True" in proc.stdout, proc.stdout + proc.stderr[-2000:]
