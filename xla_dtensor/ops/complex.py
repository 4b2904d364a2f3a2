"""Complex-number lowerings: view_as_complex / view_as_real, polar, complex, real/imag parts, conj.

Lazy tensors never carry torch's conjugate or negative bits: ``_conj`` and ``_neg_view``
produce the conjugated / negated values, so ``resolve_conj`` / ``resolve_neg`` are
identities (see ``cast.py``). Complex rotary embeddings (torchtitan's Llama:
``view_as_complex`` -> complex multiply -> ``view_as_real``) lower to plain
elementwise XLA ops on complex64.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.view_as_complex.default)(jnp.asarray([[1.0, 2.0]])).tolist()
    [(1+2j)]
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten
_COMPLEX = {jnp.dtype(jnp.float32): jnp.complex64, jnp.dtype(jnp.float64): jnp.complex128}


@lowering(aten.view_as_complex.default)
def _view_as_complex(x: jax.Array) -> jax.Array:
    if jnp.dtype(x.dtype) not in _COMPLEX:
        raise NotImplementedError(
            f"view_as_complex of a {x.dtype} array: only float32/float64 tensors (writing through a "
            "view_as_complex view is not supported on the jax device)")
    if x.ndim == 0 or x.shape[-1] != 2:
        raise RuntimeError(f"Tensor must have a last dimension of size 2, got shape {x.shape}")
    return jax.lax.complex(x[..., 0], x[..., 1])


@lowering(aten.view_as_real.default)
def _view_as_real(x: jax.Array) -> jax.Array:
    if not jnp.iscomplexobj(x):
        raise NotImplementedError(
            f"view_as_real of a {x.dtype} array: only complex tensors (writing through a view_as_real view "
            "is not supported on the jax device)")
    return jnp.stack([jnp.real(x), jnp.imag(x)], axis=-1)


@lowering(aten.polar.default)
def _polar(r: jax.Array, theta: jax.Array) -> jax.Array:
    return jax.lax.complex(r * jnp.cos(theta), r * jnp.sin(theta))


@lowering(aten.complex.default)
def _complex(re: jax.Array, im: jax.Array) -> jax.Array:
    re, im = jnp.broadcast_arrays(re, im)
    return jax.lax.complex(re, im)


@lowering(aten.imag.default)
def _imag(x: jax.Array) -> jax.Array:
    if not jnp.iscomplexobj(x):
        raise RuntimeError("imag is not implemented for tensors with non-complex dtypes.")
    return jnp.imag(x)


@lowering(aten._conj.default, aten.conj.default, aten.conj_physical.default)
def _conj(x: jax.Array) -> jax.Array:
    return jnp.conj(x) if jnp.iscomplexobj(x) else x


@lowering(aten._neg_view.default)
def _neg_view(x: jax.Array) -> jax.Array:
    return jnp.negative(x)
