"""Dtype conversion and copy lowerings: _to_copy, copy, clone, convert_element_type.

Conversions follow XLA's convert, which matches torch on defined inputs: float -> int
truncates toward zero, anything -> bool is ``!= 0`` (NaN -> True), float -> bf16/fp16
rounds to nearest even. Out-of-range float -> int is undefined in both.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten._to_copy.default)(jnp.ones(2), dtype=torch.bfloat16).dtype
    dtype(bfloat16)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten
prims = torch.ops.prims


def convert(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    """``x`` converted to torch dtype ``dtype`` with torch's semantics.

    Example:
        >>> convert(jnp.asarray([-1.5, 0.0, jnp.nan]), torch.bool).tolist()
        [True, False, True]
    """
    jdt = to_jax(dtype)
    if x.dtype == jdt:
        return x
    if jdt == jnp.bool_:
        return x != 0
    if jnp.iscomplexobj(x) and not jnp.issubdtype(jdt, jnp.complexfloating):
        x = jnp.real(x)
    return x.astype(jdt)


@lowering(aten._to_copy.default)
def _to_copy(x: jax.Array, *, dtype: torch.dtype | None = None, layout: Any = None, device: Any = None,
             pin_memory: Any = None, non_blocking: bool = False, memory_format: Any = None) -> jax.Array:
    return x if dtype is None else convert(x, dtype)


@lowering(prims.convert_element_type.default)
def _convert_element_type(x: jax.Array, dtype: torch.dtype) -> jax.Array:
    return convert(x, dtype)


@lowering(aten.copy.default)
def _copy(self: jax.Array, src: jax.Array, non_blocking: bool = False) -> jax.Array:
    return jnp.broadcast_to(convert(src, torch_dtype(self)), self.shape)


@lowering(aten.clone.default, aten.contiguous.default, aten.resolve_conj.default, aten.resolve_neg.default)
def _clone(x: jax.Array, *, memory_format: Any = None) -> jax.Array:
    return x


@lowering(aten.type_as.default)
def _type_as(x: jax.Array, other: jax.Array) -> jax.Array:
    return convert(x, torch_dtype(other))


@lowering(aten._assert_tensor_metadata.default)
def _assert_tensor_metadata(x: jax.Array, *args: Any, **kwargs: Any) -> None:
    return None


def as_value(x: Any, dtype: torch.dtype) -> jax.Array:
    """A Python number or array as a JAX array of torch dtype ``dtype`` (bool semantics kept)."""
    if isinstance(x, (bool, int, float, complex)) or getattr(x, "weak_type", False):
        return cast(x, dtype) if dtype != torch.bool else jnp.asarray(x != 0 if not isinstance(x, bool) else x)
    return convert(x, dtype)


del jax
