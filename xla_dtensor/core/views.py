"""Views: replaying a view chain and writing through it.

A write to a view becomes a scatter into the storage's value. The scatter indices are
the view chain applied to ``arange(base.size).reshape(base.shape)``: every view op is an
index remapping, so one generic rule covers slices, selects, transposes, reshapes,
diagonals and views of views alike; XLA folds the index computation to a constant.
"""
from __future__ import annotations

from typing import Any, Callable

import jax.numpy as jnp

from xla_dtensor.core.ir import Node, getitem, make_node


class ViewStep:
    """One view op in a chain: ``entry`` is the op's signature entry, ``index`` the output."""

    __slots__ = ("entry", "index")

    def __init__(self, entry: Any, index: int | None) -> None:
        self.entry, self.index = entry, index

    def replay(self, value: Node) -> Node:
        e = self.entry
        node = make_node(e.op, e.key, e.h, (value,), e.fn)
        return node if self.index is None else getitem(node, self.index)

    def apply_raw(self, array: Any) -> Any:
        out = self.entry.raw(array)
        return out if self.index is None else out[self.index]


_SCATTER_FNS: dict[tuple, Callable[[Any, Any], Any]] = {}


def _scatter_fn(chain: tuple[ViewStep, ...]) -> Callable[[Any, Any], Any]:
    def scatter(base: Any, value: Any) -> Any:
        index_dtype = jnp.int32 if base.size < 2**31 else jnp.int64
        idx = jnp.arange(base.size, dtype=index_dtype).reshape(base.shape)
        for step in chain:
            idx = step.apply_raw(idx)
        flat = base.reshape(-1).at[idx.reshape(-1)].set(value.reshape(-1).astype(base.dtype))
        return flat.reshape(base.shape)
    return scatter


def scatter_into(base: Node, base_meta: tuple, chain: tuple[ViewStep, ...], value: Node) -> Node:
    """The storage value after writing ``value`` through view ``chain``."""
    key = ("view_scatter", tuple((s.entry.key, s.index) for s in chain))
    fn = _SCATTER_FNS.get(key)
    if fn is None:
        fn = _SCATTER_FNS[key] = _scatter_fn(chain)
    return make_node("view_scatter", key, hash(key), (base, value), fn)
