"""The ``_foreach_*`` family, lowered by one generic loop over the elementwise table.

``_foreach_X.ov(lists..., others...)`` runs ``X``'s lowering once per index: schema
arguments of type ``Tensor[]`` / ``Scalar[]`` are zipped, the rest are shared, and
the ``scalars`` tensor of ``addcmul/addcdiv.Tensor`` is indexed per element. The
in-place forms (``_foreach_add_.List``) are registered by ``register_inplace_variants``
and return the new values of ``self``.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> out = get_lowering(torch.ops.aten._foreach_mul.Scalar)([jnp.ones(2), jnp.ones(3)], 2.0)
    >>> [o.tolist() for o in out]
    [[2.0, 2.0], [2.0, 2.0, 2.0]]
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from xla_dtensor.ops.reduction import vector_norm
from xla_dtensor.ops.registry import Lowering, get_lowering, lowering

aten = torch.ops.aten

_UNARY = ["abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
          "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "sigmoid", "sign", "sin", "sinh",
          "sqrt", "tan", "tanh", "trunc", "rsqrt", "zero"]
_BINARY = {"add": "Tensor", "sub": "Tensor", "mul": "Tensor", "div": "Tensor", "clamp_min": "default",
           "clamp_max": "default", "maximum": "default", "minimum": "default", "pow": "Tensor_Tensor",
           "lerp": "Tensor", "addcmul": "default", "addcdiv": "default", "copy": "default"}
_VALUE_KW = {"addcmul", "addcdiv"}  # their 4th foreach argument is the base op's keyword ``value``


def _foreach(op: Any, base: Lowering, value_kw: bool) -> Lowering:
    args_schema = [a for a in op._schema.arguments if not a.kwarg_only]
    zipped = [str(a.type).startswith("List[") for a in args_schema]
    indexed = [a.name == "scalars" and str(a.type) == "Tensor" for a in args_schema]

    def lower(*args: Any, **kwargs: Any) -> list[Any]:
        n = next(len(a) for a, z in zip(args, zipped) if z)
        out = []
        for i in range(n):
            call = [a[i] if (z or ix) else a for a, z, ix in zip(args, zipped, indexed)]
            if value_kw and len(call) > 3:
                out.append(base(*call[:3], value=call[3], **kwargs))
            else:
                out.append(base(*call, **kwargs))
        return out
    lower.__name__ = f"_foreach_{base.__name__.lstrip('_')}"
    return lower


def _register_family() -> int:
    count = 0
    names: list[tuple[str, str]] = [(n, "default") for n in _UNARY] + list(_BINARY.items())
    for name, base_overload in names:
        packet = getattr(aten, f"_foreach_{name}", None)
        base = get_lowering(getattr(getattr(aten, name), base_overload))
        if packet is None or base is None:
            continue
        for ov in packet.overloads():
            if ov.endswith("out"):
                continue
            op = getattr(packet, ov)
            if get_lowering(op) is None:
                lowering(op)(_foreach(op, base, name in _VALUE_KW))
                count += 1
    return count


@lowering(aten._foreach_norm.Scalar)
def _foreach_norm(tensors: list[Any], ord: Any = 2, dtype: torch.dtype | None = None) -> list[Any]:
    return [vector_norm(t, ord, tuple(range(t.ndim)), False, dtype) for t in tensors]


@lowering(aten._foreach_max.default)
def _foreach_max(tensors: list[Any]) -> list[Any]:
    amax: Callable[..., Any] = get_lowering(aten.amax.default)
    return [amax(t) for t in tensors]


REGISTERED = _register_family()
