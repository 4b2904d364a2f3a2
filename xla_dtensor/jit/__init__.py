"""``xla_dtensor.compile``: trace a function once per input signature, replay it without Python.

Example:
    >>> import torch, xla_dtensor
    >>> f = xla_dtensor.compile(lambda x: x * 2 + 1)
    >>> f(torch.ones(2, device=xla_dtensor.device())).tolist()
    [3.0, 3.0]
"""
from __future__ import annotations

from xla_dtensor.jit.function import (CompiledFunction, DataDependentWarning, FreedInputWarning, GraphChangedWarning,
                                      HyperparameterWarning, RetraceWarning, UnevenLayoutWarning, compile)
from xla_dtensor.jit.hidden import HiddenStateWarning

__all__ = ["CompiledFunction", "DataDependentWarning", "FreedInputWarning", "GraphChangedWarning",
           "HiddenStateWarning", "HyperparameterWarning", "RetraceWarning", "UnevenLayoutWarning", "compile"]
