"""Temporary lowering fixes the core needs until the lowering table has them.

NOTE: overrides registry entries in place; remove each fix once the table's own
lowering passes the core's tests (tracked in the lazy-core report).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops import nn as _nn
from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import _LOWERINGS

aten = torch.ops.aten


def _nll_loss_backward(grad: jax.Array, x: jax.Array, target: jax.Array, weight: jax.Array | None, reduction: int,
                       ignore_index: int, total_weight: jax.Array) -> jax.Array:
    # same as ops.nn's, but one_hot gets a JAX dtype (it was given a torch dtype)
    dt = torch_dtype(x)
    c = compute_type(dt)
    _, w, safe = _nn._nll_parts(cast(x, c), target, weight, ignore_index)
    g = cast(grad, c)
    scale = -w * (g if reduction == 0 else g / cast(total_weight, c) if reduction == 1 else g)
    cdim = 1 if x.ndim >= 2 else 0
    onehot = jax.nn.one_hot(safe, x.shape[cdim], dtype=to_jax(c), axis=cdim)
    return (onehot * jnp.expand_dims(scale, cdim)).astype(to_jax(dt))


def _install() -> None:
    for op in (aten.nll_loss_backward.default, aten.nll_loss2d_backward.default):
        if getattr(_LOWERINGS.get(op), "__module__", "") == _nn.__name__:
            _LOWERINGS[op] = _nll_loss_backward


_install()
