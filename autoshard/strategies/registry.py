"""Op-name -> rule registry, filled by the family modules with :func:`register`.

Example:
    >>> from autoshard.strategies import lookup, registered_ops
    >>> lookup("aten.mm.default").__name__, "aten.mm" in registered_ops()
    ('mm', True)
"""
from __future__ import annotations

from typing import Callable, Optional

from autoshard.graph import Graph, Node
from autoshard.strategies.base import DimRule

RuleFn = Callable[[Node, Graph], Optional[DimRule]]
_RULES: dict[str, RuleFn] = {}


def register(*ops: str) -> Callable[[RuleFn], RuleFn]:
    """Register a rule for op names: a full overload (``aten.mm.default``) or a packet (``aten.mm``)."""
    def deco(fn: RuleFn) -> RuleFn:
        for op in ops:
            if op in _RULES:
                raise ValueError(f"op {op!r} already has a strategy rule ({_RULES[op].__module__})")
            _RULES[op] = fn
        return fn
    return deco


def lookup(op: str) -> RuleFn | None:
    """The rule for ``op``: exact name first, then its packet (name without the overload)."""
    return _RULES.get(op) or _RULES.get(op.rsplit(".", 1)[0])


def rule_for(node: Node, graph: Graph) -> DimRule | None:
    """The node's rule, or ``None`` when no family handles it (planned as replicated)."""
    fn = lookup(node.op)
    return None if fn is None else fn(node, graph)


def registered_ops() -> list[str]:
    return sorted(_RULES)
