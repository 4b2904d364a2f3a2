"""CPU fallback for ops without a lowering (``xla_dtensor.config.cpu_fallback = True``).

The op's tensor inputs are materialized and copied to the host, the op runs on torch
CPU, results come back as device data, and mutated arguments are written back. Every
fallback is counted in ``metrics.counters()["cpu_fallbacks"]``.
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor import metrics
from xla_dtensor.core.executor import to_cpu, to_device
from xla_dtensor.core.signature import op_info
from xla_dtensor.core.tensor import LazyTensor, new_tensor, write


def _to_host(a: Any, pairs: list) -> Any:
    if isinstance(a, LazyTensor):
        c = to_cpu(a)
        pairs.append((a, c))
        return c
    if isinstance(a, (list, tuple)):
        return type(a)(_to_host(x, pairs) for x in a)
    if isinstance(a, torch.device) and a.type == "jax":
        return torch.device("cpu")
    return a


def _to_dev(out: Any, by_id: dict[int, LazyTensor]) -> Any:
    if isinstance(out, torch.Tensor):
        if id(out) in by_id:  # an in-place op returned its (host copy of the) argument
            return by_id[id(out)]
        leaf = to_device(out)
        return new_tensor((tuple(out.shape), out.dtype, tuple(out.stride())), leaf)
    if isinstance(out, (list, tuple)):
        return type(out)(_to_dev(x, by_id) for x in out)
    return out


def run_on_cpu(op: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``op`` on CPU copies of its arguments; see the module docstring."""
    metrics._COUNTS["cpu_fallbacks"] += 1
    pairs: list[tuple[LazyTensor, torch.Tensor]] = []
    cargs = _to_host(args, pairs)
    ckwargs = {k: _to_host(v, pairs) for k, v in kwargs.items()}
    out = op(*cargs, **ckwargs)
    if op_info(op).mutated:
        for lazy, host in pairs:
            write(lazy, to_device(host))
    return _to_dev(out, {id(h): t for t, h in pairs})
