"""torch dtype <-> JAX dtype mapping and torch's type promotion rules, for lowerings.

Torch promotes by *category* (bool < integer < floating < complex) with three
priority classes: tensors with dimensions, 0-d tensors, and wrapped Python
numbers. A lower class only wins when it is of a higher category. Lowerings see
JAX values, so Python numbers and weakly typed 0-d JAX arrays count as wrapped
numbers (see ``registry`` for the convention).

Example:
    >>> import torch, jax.numpy as jnp
    >>> result_type(jnp.zeros(3, jnp.int32), 2.5)
    torch.float32
    >>> to_jax(torch.bfloat16)
    dtype(bfloat16)
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

_PAIRS: list[tuple[torch.dtype, Any]] = [
    (torch.bool, jnp.bool_), (torch.uint8, jnp.uint8), (torch.int8, jnp.int8),
    (torch.int16, jnp.int16), (torch.int32, jnp.int32), (torch.int64, jnp.int64),
    (torch.uint16, jnp.uint16), (torch.uint32, jnp.uint32), (torch.uint64, jnp.uint64),
    (torch.float16, jnp.float16), (torch.bfloat16, jnp.bfloat16), (torch.float32, jnp.float32),
    (torch.float64, jnp.float64), (torch.complex64, jnp.complex64), (torch.complex128, jnp.complex128),
    (torch.float8_e4m3fn, jnp.float8_e4m3fn), (torch.float8_e5m2, jnp.float8_e5m2),
]
_TO_JAX: dict[torch.dtype, np.dtype] = {t: np.dtype(j) for t, j in _PAIRS}
_TO_TORCH: dict[np.dtype, torch.dtype] = {np.dtype(j): t for t, j in _PAIRS}

Value = Any  # jax.Array | bool | int | float | complex


class UnsupportedDtypeError(TypeError):
    """A torch dtype with no JAX counterpart: the jax device cannot hold it."""


def to_jax(dtype: torch.dtype) -> np.dtype:
    """The JAX dtype of torch dtype ``dtype``.

    Example:
        >>> to_jax(torch.int64)
        dtype('int64')
    """
    try:
        return _TO_JAX[dtype]
    except KeyError:
        raise UnsupportedDtypeError(f"dtype {dtype} is not supported on the jax device (no JAX counterpart); "
                                    f"supported: {sorted(map(str, _TO_JAX))}") from None


def to_torch(dtype: Any) -> torch.dtype:
    """The torch dtype of a JAX/numpy dtype.

    Example:
        >>> to_torch(jnp.float32)
        torch.float32
    """
    try:
        return _TO_TORCH[np.dtype(dtype)]
    except (KeyError, TypeError):
        raise UnsupportedDtypeError(f"dtype {dtype} has no torch counterpart; "
                                    f"supported: {sorted(map(str, _TO_TORCH))}") from None


def default_float() -> torch.dtype:
    """torch's current default floating dtype (``torch.get_default_dtype()``)."""
    return torch.get_default_dtype()


def is_wrapped_scalar(x: Value) -> bool:
    """Python numbers and weakly typed 0-d JAX arrays: torch's "wrapped numbers"."""
    if isinstance(x, (bool, int, float, complex)):
        return True
    return getattr(x, "weak_type", False) and getattr(x, "ndim", 1) == 0


def torch_dtype(x: Value) -> torch.dtype:
    """The torch dtype of a JAX array, or of the tensor torch wraps a Python number in.

    Example:
        >>> torch_dtype(3), torch_dtype(jnp.zeros(2, jnp.bfloat16))
        (torch.int64, torch.bfloat16)
    """
    if isinstance(x, bool):
        return torch.bool
    if isinstance(x, int):
        return torch.int64
    if isinstance(x, float):
        return torch.float64
    if isinstance(x, complex):
        return torch.complex128
    return to_torch(x.dtype)


def is_float(dtype: torch.dtype) -> bool:
    """Floating point (not complex)."""
    return dtype.is_floating_point


def is_integral(dtype: torch.dtype, include_bool: bool = False) -> bool:
    """Integer dtype (bool only when ``include_bool``)."""
    if dtype == torch.bool:
        return include_bool
    return not dtype.is_floating_point and not dtype.is_complex


def _promote(a: torch.dtype | None, b: torch.dtype | None) -> torch.dtype | None:
    if a is None:
        return b
    if b is None:
        return a
    return torch.promote_types(a, b)


def _combine(higher: torch.dtype | None, lower: torch.dtype | None) -> torch.dtype | None:
    # Mirrors c10's combine_categories: a lower-priority class only counts when it is
    # of a higher category than the higher-priority class.
    if higher is not None and higher.is_complex:
        return higher
    if lower is not None and lower.is_complex:
        if higher is not None and higher.is_floating_point:
            return torch.promote_types(higher, torch.complex64) if higher != torch.float64 else torch.complex128
        return lower
    if higher is not None and higher.is_floating_point:
        return higher
    if higher == torch.bool or (lower is not None and lower.is_floating_point):
        return _promote(higher, lower)
    return higher if higher is not None else lower


@lru_cache(maxsize=4096)
def _result(dims: tuple, zeros: tuple, wrapped: tuple) -> torch.dtype:
    d = z = w = None
    for t in dims:
        d = _promote(d, t)
    for t in zeros:
        z = _promote(z, t)
    for t in wrapped:
        if t.is_floating_point:
            t = default_float()
        elif t.is_complex:
            t = torch.complex128 if default_float() == torch.float64 else torch.complex64
        w = _promote(w, t)
    out = _combine(d, _combine(z, w))
    if out is None:
        raise TypeError("result_type needs at least one tensor or scalar")
    return out


def result_type(*args: Value) -> torch.dtype:
    """torch's result dtype of an elementwise op on ``args`` (``None`` entries ignored).

    Example:
        >>> result_type(jnp.zeros(3, jnp.bool_), 1)
        torch.int64
        >>> result_type(jnp.zeros(3, jnp.float16), jnp.zeros((), jnp.float64))
        torch.float16
    """
    dims, zeros, wrapped = [], [], []
    for a in args:
        if a is None:
            continue
        if is_wrapped_scalar(a):
            wrapped.append(torch_dtype(a))
        elif a.ndim == 0:
            zeros.append(torch_dtype(a))
        else:
            dims.append(torch_dtype(a))
    return _result(tuple(dims), tuple(zeros), tuple(wrapped))


def float_type(dtype: torch.dtype) -> torch.dtype:
    """``dtype`` if floating/complex, else the default float (torch's int-to-float rule)."""
    return dtype if (dtype.is_floating_point or dtype.is_complex) else default_float()


def compute_type(dtype: torch.dtype) -> torch.dtype:
    """The dtype torch computes in for ``dtype`` (float32 for half types: "opmath")."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def cast(x: Value, dtype: torch.dtype) -> jax.Array:
    """``x`` (array or Python number) as a JAX array of torch dtype ``dtype``."""
    jdt = to_jax(dtype)
    if isinstance(x, (bool, int, float, complex)):
        return jnp.asarray(x, dtype=jdt)
    return x if x.dtype == jdt and not getattr(x, "weak_type", False) else x.astype(jdt)
