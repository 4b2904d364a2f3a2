"""Sharding strategies per op family, registered by decorator (one module per family).

Example:
    >>> from autoshard.strategies import DimRule, enumerate_strategies, registered_ops
    >>> len(registered_ops()) > 50
    True
"""
from __future__ import annotations

from autoshard.strategies import (  # noqa: F401  (registration side effects)
    attention, cat, conv, elementwise, embedding, factory, index, loss, matmul, moe, norm, optimizer, pad, reduction,
    scan, scatter_views, triangular, view, view_backward)
from autoshard.strategies.base import PARTIAL, DimRule, Strategy, enumerate_strategies, follow_strategies
from autoshard.strategies.registry import lookup, register, registered_ops, rule_for

__all__ = ["DimRule", "PARTIAL", "Strategy", "enumerate_strategies", "follow_strategies", "lookup",
           "register", "registered_ops", "rule_for"]
