"""Program dumps: the StableHLO and HLO that computing some tensors would run.

Example:
    >>> import torch, xla_dtensor
    >>> x = torch.ones(2, device=xla_dtensor.device()) * 2
    >>> "multiply" in xla_dtensor.get_stablehlo([x])
    True
"""
from __future__ import annotations

from typing import Any, Sequence

from xla_dtensor.core import executor
from xla_dtensor.core.tensor import LazyTensor, value_of

__all__ = ["get_stablehlo", "get_hlo"]


def _lowered(tensors: Sequence[LazyTensor] | LazyTensor) -> Any:
    if isinstance(tensors, LazyTensor):
        tensors = [tensors]
    bad = [type(t).__name__ for t in tensors if not isinstance(t, LazyTensor)]
    if bad:
        raise TypeError(f"expected tensors on the jax device, got {', '.join(bad)}")
    return executor.lower(executor.make_plan([value_of(t) for t in tensors]))


def get_stablehlo(tensors: Sequence[LazyTensor] | LazyTensor) -> str:
    """The StableHLO module computing ``tensors`` from their device-data leaves (nothing runs).

    Example:
        >>> import torch, xla_dtensor
        >>> get_stablehlo(torch.zeros(1, device=xla_dtensor.device()) + 1).startswith("module")
        True
    """
    return _lowered(tensors).as_text()


def get_hlo(tensors: Sequence[LazyTensor] | LazyTensor, optimized: bool = False) -> str:
    """The HLO text computing ``tensors``; ``optimized=True``: after XLA's passes and SPMD partitioning.

    ``optimized`` compiles the program (an XLA compile, counted in ``xla_compiles``).

    Example:
        >>> import torch, xla_dtensor
        >>> "HloModule" in get_hlo(torch.zeros(1, device=xla_dtensor.device()) + 1)
        True
    """
    low = _lowered(tensors)
    if optimized:
        return low.compile().as_text()
    return low.as_text(dialect="hlo")
