"""Tables keyed by torch ops, looked up by the op's identity.

``OpOverload.__hash__`` is a Python method (~0.3-0.5 us a call), and recording one op
looked its op up in four dicts (special handlers, op info, entries, list returns): a
sixth of a 12-layer GPT step's forward recording. Ops are process-lifetime singletons,
so ``id(op)`` names one exactly; each table keeps its ops alive anyway.

Example:
    >>> import torch
    >>> t = OpTable()
    >>> t[torch.ops.aten.add.Tensor] = "add"
    >>> t.get(torch.ops.aten.add.Tensor), torch.ops.aten.mul.Tensor in t
    ('add', False)
"""
from __future__ import annotations

from typing import Any, Iterator, Mapping


class OpTable:
    """A mapping op -> value; ``by_id`` (``id(op)`` -> value) is for hot paths."""

    __slots__ = ("by_id", "_ops")

    def __init__(self) -> None:
        self.by_id: dict[int, Any] = {}
        self._ops: dict[int, Any] = {}

    def get(self, op: Any, default: Any = None) -> Any:
        return self.by_id.get(id(op), default)

    def __getitem__(self, op: Any) -> Any:
        return self.by_id[id(op)]

    def __setitem__(self, op: Any, value: Any) -> None:
        self.by_id[id(op)] = value
        self._ops[id(op)] = op

    def __delitem__(self, op: Any) -> None:
        del self.by_id[id(op)], self._ops[id(op)]

    def __contains__(self, op: Any) -> bool:
        return id(op) in self.by_id

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._ops.values()))

    def __len__(self) -> int:
        return len(self.by_id)

    def update(self, mapping: Mapping[Any, Any]) -> None:
        for op, value in mapping.items():
            self[op] = value

    def clear(self) -> None:
        self.by_id.clear()
        self._ops.clear()
