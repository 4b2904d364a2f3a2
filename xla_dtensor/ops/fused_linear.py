"""``xla_dtensor::linear``: ``F.linear`` on an input of any rank as one op.

torch decomposes ``F.linear`` of a 3-D input (every transformer layer's projections) into
``t``, ``view``, ``addmm`` and ``view``: four recorded ops, each a Python dispatch on the
``jax`` device. :mod:`xla_dtensor.core.linear` routes the call here instead. The math is
torch CPU's ``addmm`` path: the product accumulates in float32 for half types and the bias
is added before the one rounding to the input's dtype.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(LINEAR)(jnp.ones((2, 3, 4)), jnp.ones((5, 4)), jnp.ones(5)).shape
    (2, 3, 5)
"""
from __future__ import annotations

from typing import Any

import jax
import torch

from xla_dtensor.ops.dtypes import to_jax, torch_dtype
from xla_dtensor.ops.matmul import _scaled_add, matmul
from xla_dtensor.ops.registry import lowering

_LIB = torch.library.Library("xla_dtensor", "FRAGMENT")  # noqa: TOR901  (kept alive: the op lives with it)
_LIB.define("linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor")
_LIB.impl("linear", lambda x, w, b: x.new_empty((*x.shape[:-1], w.shape[0])), "Meta")
LINEAR = torch.ops.xla_dtensor.linear.default


@lowering(LINEAR)
def _linear(x: jax.Array, w: jax.Array, b: Any = None) -> jax.Array:
    prod = matmul(x, w.T, "linear", keep_acc=True)
    dt = torch_dtype(x)
    return prod.astype(to_jax(dt)) if b is None else _scaled_add("linear", b, prod, 1, 1, dt)
