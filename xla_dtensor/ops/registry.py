"""Registry of aten -> JAX lowerings, filled by decorator from one module per op family.

A lowering is a pure function of JAX arrays: it receives the aten op's arguments
with every tensor replaced by a ``jax.Array`` (scalars, shapes, dtypes and other
static arguments as torch gives them) and returns a ``jax.Array`` or a tuple of them,
exactly matching the aten op's outputs (shape and dtype as torch CPU produces).

Example:
    >>> import torch, jax.numpy as jnp
    >>> @lowering(torch.ops.aten.neg.default)
    ... def _neg(x):
    ...     return jnp.negative(x)
"""
from __future__ import annotations

from typing import Any, Callable

Lowering = Callable[..., Any]
_LOWERINGS: dict[Any, Lowering] = {}


def lowering(*ops: Any) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each aten overload in ``ops``.

    Passing an overload packet (``aten.add``) registers all its overloads.
    """
    def register(fn: Lowering) -> Lowering:
        for op in ops:
            overloads = [getattr(op, name) for name in op.overloads()] if hasattr(op, "overloads") else [op]
            for overload in overloads:
                if overload in _LOWERINGS:
                    raise ValueError(f"{overload} already has a lowering ({_LOWERINGS[overload].__name__})")
                _LOWERINGS[overload] = fn
        return fn
    return register


def get_lowering(op: Any) -> Lowering | None:
    """The lowering registered for aten overload ``op``, or ``None``."""
    return _LOWERINGS.get(op)


def registered_ops() -> list[Any]:
    """All aten overloads with a lowering."""
    return list(_LOWERINGS)
