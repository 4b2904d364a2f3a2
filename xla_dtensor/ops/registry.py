"""Registry of aten -> JAX lowerings, filled by decorator from one module per op family.

A lowering is a pure, traceable function of JAX arrays: it receives the aten op's
arguments in schema order (keyword-only schema arguments as keywords) with every
tensor replaced by a ``jax.Array`` (or tracer), and returns a ``jax.Array`` or a
tuple/list of them, exactly matching the aten op's outputs: same shapes, and the
dtype torch CPU produces (torch's type promotion, e.g. ``int + 2.5 -> float32``,
``sum(bool) -> int64``, comparisons -> ``bool``).

Conventions the caller (the lazy core) relies on:

* **Static arguments** (dims, shapes, dtypes, flags, reduction modes, ``ord``) are
  Python values as torch gives them. They must stay Python values under
  ``jax.jit`` / ``jax.eval_shape``: close over them (``functools.partial``), never
  pass them as traced positional arguments.
* **Scalars that are values** (``alpha``, ``other`` of ``add.Scalar``, fill values,
  ``lr``) may be Python numbers *or* weakly typed 0-d JAX arrays (what ``jax.jit``
  makes of a Python scalar argument). Both count as torch "wrapped numbers" in type
  promotion, so a lowered graph can take scalars as parameters without changing
  dtypes. A strongly typed 0-d array counts as a 0-d tensor.
* **Random ops** are registered with ``@lowering(op, random=True)`` and receive a
  JAX PRNG key (``jax.random.key`` or legacy ``uint32[2]``) as an extra *first*
  argument, before the aten arguments; ``generator=`` keywords are ignored. The
  caller draws one fresh key per random node from ``xla_dtensor.ops.random``'s
  generator and feeds it as graph input data (so the same graph is reused).
  Bit-equality with torch's CPU generator is not a goal; distributions are.
* **In-place overloads** (``add_.Tensor``, ``_foreach_mul_.Scalar``, ``copy_``)
  are registered with their functional lowering: they return the new value(s) of
  the mutated argument(s) and the caller rebinds.
* **``.out`` overloads** are never registered.

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
_RANDOM: set[Any] = set()
_TRACED_FLOATS: dict[Any, frozenset[str]] = {}


def _overloads(op: Any) -> list[Any]:
    if hasattr(op, "overloads"):
        return [getattr(op, name) for name in op.overloads() if not name.endswith("out")]
    return [op]


def lowering(*ops: Any, random: bool = False) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each aten overload in ``ops``.

    Passing an overload packet (``aten.add``) registers all its overloads except
    ``out`` variants. ``random=True`` marks lowerings that take a PRNG key first.

    Example:
        >>> import torch, jax.numpy as jnp
        >>> @lowering(torch.ops.aten.sgn.default)
        ... def _sgn(x):
        ...     return jnp.sign(x)
        >>> get_lowering(torch.ops.aten.sgn.default) is _sgn
        True
    """
    def register(fn: Lowering) -> Lowering:
        for op in ops:
            for overload in _overloads(op):
                if overload in _LOWERINGS:
                    raise ValueError(f"{overload} already has a lowering ({_LOWERINGS[overload].__name__})")
                _LOWERINGS[overload] = fn
                if random:
                    _RANDOM.add(overload)
        return fn
    return register


def get_lowering(op: Any) -> Lowering | None:
    """The lowering registered for aten overload ``op``, or ``None``."""
    return _LOWERINGS.get(op)


def is_random(op: Any) -> bool:
    """Whether ``op``'s lowering takes a PRNG key as its first argument."""
    return op in _RANDOM


def traced_floats(*ops: Any, names: tuple[str, ...]) -> None:
    """Record that the lowerings of ``ops`` take their keyword-only ``float`` arguments ``names`` as
    traced values: the lazy core then makes each a scalar program input (0 and 1 stay literals),
    as it does for ``Scalar`` arguments, instead of a constant of the program.

    NOTE: for hyperparameters that change every step (a learning-rate schedule): as constants,
    each new value is a new program, compiled anew.

    Example:
        >>> import torch
        >>> traced_floats(torch.ops.aten._fused_sgd_.default, names=("lr",))
        >>> "lr" in traced_float_names(torch.ops.aten._fused_sgd_.default)
        True
    """
    for op in ops:
        for overload in _overloads(op):
            _TRACED_FLOATS[overload] = _TRACED_FLOATS.get(overload, frozenset()) | frozenset(names)


def traced_float_names(op: Any) -> frozenset[str]:
    """The ``float`` arguments of ``op`` its lowering takes traced (see :func:`traced_floats`)."""
    return _TRACED_FLOATS.get(op, frozenset())


def registered_ops() -> list[Any]:
    """All aten overloads with a lowering."""
    return list(_LOWERINGS)


def register_inplace_variants() -> int:
    """Register ``aten.X_.ov`` with the lowering of ``aten.X.ov`` where the former exists.

    Returns the number of in-place overloads added. Idempotent.
    """
    import torch

    added = 0
    for op in list(_LOWERINGS):
        packet_name = op.name().split("::")[-1].split(".")[0]
        if packet_name.endswith("_"):
            continue
        inplace = getattr(torch.ops.aten, packet_name + "_", None)
        overload = getattr(inplace, op._overloadname, None) if inplace is not None else None
        if overload is None or overload in _LOWERINGS:
            continue
        _LOWERINGS[overload] = _LOWERINGS[op]
        if op in _RANDOM:
            _RANDOM.add(overload)
        added += 1
    return added
