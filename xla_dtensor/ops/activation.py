"""Activation lowerings and their backward ops: relu, gelu, silu, sigmoid/tanh backward, elu, ...

Half types compute in float32 and round once, as torch CPU does.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.relu.default)(jnp.asarray([-1.0, 2.0])).tolist()
    [0.0, 2.0]
"""
from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, compute_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten


def _opmath(fn: Callable[..., jax.Array]) -> Callable[..., jax.Array]:
    """Run ``fn`` on the tensors cast to their compute dtype; round the result to the first's dtype."""
    def lower(x: jax.Array, *args: Any, **kwargs: Any) -> jax.Array:
        dt = torch_dtype(x)
        c = compute_type(dt)
        conv = [cast(a, c) if hasattr(a, "dtype") and not isinstance(a, (bool, int, float)) else a for a in args]
        return fn(cast(x, c), *conv, **kwargs).astype(to_jax(dt))
    lower.__name__ = fn.__name__
    return lower


@lowering(aten.relu.default)
def _relu(x: jax.Array) -> jax.Array:
    if x.dtype == jnp.bool_:
        raise TypeError("relu: bool tensors are not supported (torch raises too)")
    return jnp.maximum(x, jnp.zeros((), x.dtype))


_SQRT_2_OVER_PI = math.sqrt(2 / math.pi)


@lowering(aten.gelu.default)
@_opmath
def _gelu(x: jax.Array, *, approximate: str = "none") -> jax.Array:
    if approximate == "tanh":
        return 0.5 * x * (1 + jnp.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))
    if approximate != "none":
        raise ValueError(f"gelu: approximate={approximate!r}; allowed: 'none', 'tanh'")
    return 0.5 * x * (1 + jax.scipy.special.erf(x / math.sqrt(2)))


@lowering(aten.gelu_backward.default)
def _gelu_backward(grad: jax.Array, x: jax.Array, *, approximate: str = "none") -> jax.Array:
    dt = torch_dtype(grad)
    c = compute_type(dt)
    g, y = cast(grad, c), cast(x, c)
    if approximate == "tanh":
        inner = _SQRT_2_OVER_PI * (y + 0.044715 * y ** 3)
        t = jnp.tanh(inner)
        d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * y ** 2)
        d = 0.5 * (1 + t) + 0.5 * y * (1 - t * t) * d_inner
    else:
        cdf = 0.5 * (1 + jax.scipy.special.erf(y / math.sqrt(2)))
        pdf = jnp.exp(-0.5 * y * y) / math.sqrt(2 * math.pi)
        d = cdf + y * pdf
    return (g * d).astype(to_jax(dt))


@lowering(aten.silu.default)
@_opmath
def _silu(x: jax.Array) -> jax.Array:
    return x * jax.nn.sigmoid(x)


@lowering(aten.silu_backward.default)
@_opmath
def _silu_backward(grad: jax.Array, x: jax.Array) -> jax.Array:
    s = jax.nn.sigmoid(x)
    return grad * s * (1 + x * (1 - s))


@lowering(aten.sigmoid_backward.default)
@_opmath
def _sigmoid_backward(grad: jax.Array, out: jax.Array) -> jax.Array:
    return grad * out * (1 - out)


@lowering(aten.tanh_backward.default)
@_opmath
def _tanh_backward(grad: jax.Array, out: jax.Array) -> jax.Array:
    return grad * (1 - out * out)


@lowering(aten.threshold.default)
def _threshold(x: jax.Array, threshold: Any, value: Any) -> jax.Array:
    dt = torch_dtype(x)
    return jnp.where(x <= cast(threshold, dt), cast(value, dt), x)


@lowering(aten.threshold_backward.default)
def _threshold_backward(grad: jax.Array, x: jax.Array, threshold: Any) -> jax.Array:
    return jnp.where(x <= cast(threshold, torch_dtype(x)), jnp.zeros((), grad.dtype), grad)


@lowering(aten.leaky_relu.default)
@_opmath
def _leaky_relu(x: jax.Array, negative_slope: Any = 0.01) -> jax.Array:
    return jnp.where(x > 0, x, x * negative_slope)


@lowering(aten.leaky_relu_backward.default)
@_opmath
def _leaky_relu_backward(grad: jax.Array, x: jax.Array, negative_slope: Any, self_is_result: bool) -> jax.Array:
    return jnp.where(x > 0, grad, grad * negative_slope)


@lowering(aten.elu.default)
@_opmath
def _elu(x: jax.Array, alpha: Any = 1, scale: Any = 1, input_scale: Any = 1) -> jax.Array:
    return jnp.where(x > 0, x * scale, alpha * scale * jnp.expm1(x * input_scale))


@lowering(aten.elu_backward.default)
@_opmath
def _elu_backward(grad: jax.Array, alpha: Any, scale: Any, input_scale: Any, is_result: bool,
                  x: jax.Array) -> jax.Array:
    if is_result:
        neg = grad * input_scale * (x + alpha * scale)
    else:
        neg = grad * input_scale * alpha * scale * jnp.exp(x * input_scale)
    return jnp.where(x > 0, grad * scale, neg)


@lowering(aten.hardtanh.default)
def _hardtanh(x: jax.Array, min_val: Any = -1, max_val: Any = 1) -> jax.Array:
    dt = torch_dtype(x)
    return jnp.minimum(jnp.maximum(x, cast(min_val, dt)), cast(max_val, dt))


@lowering(aten.hardtanh_backward.default)
def _hardtanh_backward(grad: jax.Array, x: jax.Array, min_val: Any, max_val: Any) -> jax.Array:
    dt = torch_dtype(x)
    inside = (x > cast(min_val, dt)) & (x < cast(max_val, dt))
    return jnp.where(inside, grad, jnp.zeros((), grad.dtype))


@lowering(aten.softplus.default)
@_opmath
def _softplus(x: jax.Array, beta: Any = 1, threshold: Any = 20) -> jax.Array:
    return jnp.where(x * beta > threshold, x, jnp.log1p(jnp.exp(x * beta)) / beta)


@lowering(aten.softplus_backward.default)
@_opmath
def _softplus_backward(grad: jax.Array, x: jax.Array, beta: Any, threshold: Any) -> jax.Array:
    z = jnp.exp(x * beta)
    return jnp.where(x * beta > threshold, grad, grad * z / (z + 1))


@lowering(aten.mish.default)
@_opmath
def _mish(x: jax.Array) -> jax.Array:
    return x * jnp.tanh(jax.nn.softplus(x))


@lowering(aten.hardswish.default)
@_opmath
def _hardswish(x: jax.Array) -> jax.Array:
    return x * jnp.clip(x + 3, 0, 6) / 6


@lowering(aten.hardsigmoid.default)
@_opmath
def _hardsigmoid(x: jax.Array) -> jax.Array:
    return jnp.clip(x + 3, 0, 6) / 6


@lowering(aten.log_sigmoid_forward.default)
def _log_sigmoid_forward(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    dt = torch_dtype(x)
    y = cast(x, compute_type(dt))
    # the buffer is torch CPU's (exp(-|x|), consumed by log_sigmoid_backward); CUDA returns it empty
    return jax.nn.log_sigmoid(y).astype(to_jax(dt)), jnp.exp(-jnp.abs(y)).astype(to_jax(dt))


@lowering(aten.glu.default)
def _glu(x: jax.Array, dim: int = -1) -> jax.Array:
    a, b = jnp.split(x, 2, axis=dim)
    dt = torch_dtype(x)
    return (cast(a, compute_type(dt)) * jax.nn.sigmoid(cast(b, compute_type(dt)))).astype(to_jax(dt))


@lowering(aten._prelu_kernel.default)
def _prelu_kernel(x: jax.Array, weight: jax.Array) -> jax.Array:
    return jnp.where(x > 0, x, x * weight)
