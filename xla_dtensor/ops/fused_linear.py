"""``xla_dtensor::linear``: ``F.linear`` on an input of any rank as one op.

torch decomposes ``F.linear`` of a 3-D input (every transformer layer's projections) into
``t``, ``view``, ``addmm`` and ``view``: four recorded ops, each a Python dispatch on the
``jax`` device. :mod:`xla_dtensor.core.linear` routes the call here instead. The math is
torch CPU's ``addmm`` path: the product accumulates in float32 for half types and the bias
is added before the one rounding to the input's dtype.

``xla_dtensor::linear_backward(grad, input, weight, bias)`` is its gradient as one op: the
input's (``grad @ weight``), the weight's (``grad.T @ input`` over every leading dim) and,
with ``bias``, the bias's (``grad`` summed over the leading dims), each accumulated in
float32 for half types, as torch CPU's ``mm`` and ``sum`` do. torch's formula in torch ops
records ~9 ops (views, transposes, two matmuls, a sum) on the autograd thread.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(LINEAR)(jnp.ones((2, 3, 4)), jnp.ones((5, 4)), jnp.ones(5)).shape
    (2, 3, 5)
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import to_jax, torch_dtype
from xla_dtensor.ops.matmul import _scaled_add, matmul
from xla_dtensor.ops.registry import lowering

_LIB = torch.library.Library("xla_dtensor", "FRAGMENT")  # noqa: TOR901  (kept alive: the op lives with it)
_LIB.define("linear(Tensor input, Tensor weight, Tensor? bias) -> Tensor")
_LIB.impl("linear", lambda x, w, b: x.new_empty((*x.shape[:-1], w.shape[0])), "Meta")
LINEAR = torch.ops.xla_dtensor.linear.default
_LIB.define("linear_backward(Tensor grad, Tensor input, Tensor weight, bool bias) -> Tensor[]")
_LIB.impl("linear_backward", lambda g, x, w, bias: [x.new_empty(x.shape), w.new_empty(w.shape)] + (
    [w.new_empty(w.shape[:1])] if bias else []), "Meta")
LINEAR_BACKWARD = torch.ops.xla_dtensor.linear_backward.default


@lowering(LINEAR)
def _linear(x: jax.Array, w: jax.Array, b: Any = None) -> jax.Array:
    prod = matmul(x, w.T, "linear", keep_acc=True)
    dt = torch_dtype(x)
    return prod.astype(to_jax(dt)) if b is None else _scaled_add("linear", b, prod, 1, 1, dt)


@lowering(LINEAR_BACKWARD)
def _linear_backward(g: jax.Array, x: jax.Array, w: jax.Array, bias: bool) -> list[jax.Array]:
    flat_g, flat_x = g.reshape(-1, g.shape[-1]), x.reshape(-1, x.shape[-1])
    grads = [matmul(g, w, "linear_backward"), matmul(flat_g.T, flat_x, "linear_backward")]
    if bias:
        dt = torch_dtype(g)
        acc = jnp.float32 if dt in (torch.float16, torch.bfloat16) else to_jax(dt)
        grads.append(jnp.sum(flat_g.astype(acc), axis=0).astype(to_jax(dt)))
    return grads
