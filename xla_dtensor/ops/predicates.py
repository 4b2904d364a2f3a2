"""Whole-tensor predicates that return a Python ``bool``: ``torch.equal``, ``torch.allclose``.

They are not IR nodes (a ``bool`` is needed now): each records the elementwise comparison
and its ``all`` reduction, then reads the one resulting scalar (a ``sync`` of that value).

Example:
    >>> import torch, xla_dtensor
    >>> a = torch.arange(4.).to(xla_dtensor.device())
    >>> torch.equal(a, a.clone()), torch.allclose(a, a + 1e-9), torch.equal(a, a[:2])
    (True, True, False)
"""
from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten


def _read(flag: torch.Tensor) -> bool:
    """The value of a 0-d bool tensor (``.item()`` inside a dispatch would meet its meta kernel)."""
    from xla_dtensor.core.executor import to_cpu
    return bool(to_cpu(flag))


def _equal(op: Any, args: tuple, kwargs: dict) -> bool:
    a, b = args[0], args[1]
    if tuple(a.shape) != tuple(b.shape):
        return False
    return _read(torch.eq(a, b).all())


def _allclose(op: Any, args: tuple, kwargs: dict) -> bool:
    a, b = args[0], args[1]
    rest = dict(zip(("rtol", "atol", "equal_nan"), args[2:]), **kwargs)
    return _read(torch.isclose(a, b, **rest).all())


def install() -> None:
    """Route the two ops here (``import xla_dtensor`` does it, once the core is loaded)."""
    from xla_dtensor.core.dispatch import SPECIAL
    SPECIAL.update({aten.equal.default: _equal, aten.allclose.default: _allclose})
