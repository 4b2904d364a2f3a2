"""One attention op, forward and backward, lowered to the platform's fused kernel.

``xla_dtensor::attention(q, k, v, mask, bias, is_causal, scale)`` takes torch's SDPA
layout (``[B, H, L, E]``, or ``[H, L, E]``) and lowers to
``jax.nn.dot_product_attention``: cuDNN's fused (flash) attention on GPU where cuDNN
takes the shapes and dtype (bf16/fp16, head dim a multiple of 8 up to 128), a Pallas
flash kernel on TPU, XLA's math on CPU. Grouped-query attention (fewer key/value heads)
is native. ``mask`` is boolean (True: attend), ``bias`` additive.

``xla_dtensor::attention_backward`` lowers to the VJP of the same call. When the forward
was lowered into the same program (a lazy step that syncs after ``backward()``, or any
``xla_dtensor.compile`` step), the backward reuses the forward's residuals (the output
and softmax statistics) instead of recomputing the forward.

A call the platform's fused kernel cannot take (float32 or a head size over 128 on cuDNN,
see :func:`refusal`) is lowered with XLA's math: counted in
``metrics.counters()["fused_attention_fallbacks"]`` where it is recorded, with a warning
once per reason; so is (warned, not counted) a call jax's kernel refuses while lowering.

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> q = jnp.ones((1, 2, 4, 8))
    >>> get_lowering(torch.ops.xla_dtensor.attention.default)(q, q, q, None, None, True, 0.35).shape
    (1, 2, 4, 8)
"""
from __future__ import annotations

import importlib
import warnings
from collections import OrderedDict
from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from xla_dtensor import metrics
from xla_dtensor.ops.registry import lowering

_LIB = torch.library.Library("xla_dtensor", "DEF")  # noqa: TOR901  (kept alive: the ops live with it)
_LIB.define("attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? bias, bool is_causal, "
            "float scale) -> Tensor")
_LIB.define("attention_backward(Tensor grad, Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor? bias, "
            "Tensor out, bool is_causal, float scale) -> (Tensor, Tensor, Tensor)")


def _meta_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any, is_causal: bool,
                  scale: float) -> torch.Tensor:
    return q.new_empty(q.shape)


def _meta_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, bias: Any,
                   out: torch.Tensor, is_causal: bool, scale: float) -> tuple[torch.Tensor, ...]:
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


_LIB.impl("attention", _meta_forward, "Meta")
_LIB.impl("attention_backward", _meta_backward, "Meta")

ATTENTION = torch.ops.xla_dtensor.attention.default
ATTENTION_BACKWARD = torch.ops.xla_dtensor.attention_backward.default

# Forward residuals of the program being traced, by the id of the forward's output tracer.
# NOTE: the entry keeps the tracer itself, so a reused id never matches a dead one; the
# backward pops its entry; entries of forwards without a backward go oldest-first.
_RESIDUALS: OrderedDict[int, tuple[Any, Callable[..., Any]]] = OrderedDict()
_RESIDUALS_CAP = 4096
_TRACER = getattr(jax.core, "Tracer", None) or importlib.import_module("jax._src.core").Tracer
_WARNED: set[str] = set()


def _bthd(x: jax.Array) -> jax.Array:
    """torch's ``[B, H, L, E]`` as jax's ``[B, L, H, E]`` (a 3-D ``[H, L, E]`` gets a batch of 1)."""
    if x.ndim == 3:
        x = x[None]
    return jnp.swapaxes(x, 1, 2)


def refusal(platform: str, dtype: str, head_dim: int) -> str | None:
    """Why ``platform``'s fused kernel cannot take a call (``None``: it can); ``dtype`` by name.

    Example:
        >>> refusal("gpu", "float32", 64)
        'cuDNN attention takes bfloat16/float16, not float32'
        >>> refusal("gpu", "bfloat16", 64) is None, refusal("cpu", "float32", 64) is None
        (True, True)
    """
    if platform != "gpu":
        return None
    if dtype not in ("bfloat16", "float16"):
        return f"cuDNN attention takes bfloat16/float16, not {dtype}"
    if head_dim % 8 or head_dim > 128:
        return f"cuDNN attention takes head sizes that are multiples of 8 up to 128, not {head_dim}"
    return None


def warn_once(reason: str) -> None:
    """One warning per distinct reason that a call runs on XLA's math instead of the fused kernel."""
    if reason not in _WARNED:
        _WARNED.add(reason)
        warnings.warn(f"xla_dtensor attention: {reason}; this call runs XLA's math instead of the fused kernel "
                      "(counted in metrics 'fused_attention_fallbacks')", stacklevel=3)


def _xla(q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any, is_causal: bool, scale: float) -> jax.Array:
    if q.dtype == jnp.float16 and jax.default_backend() == "cpu":  # XLA:CPU has no f16 x f16 -> f32 dot
        return _xla(q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), mask, bias, is_causal,
                    scale).astype(q.dtype)
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                        implementation="xla")


def _cudnn(q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any, is_causal: bool,
           scale: float) -> jax.Array:
    return jax.nn.dot_product_attention(q, k, v, bias=bias, mask=mask, scale=scale, is_causal=is_causal,
                                        implementation="cudnn")


def _pallas_tpu(q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any, is_causal: bool,
                scale: float) -> jax.Array:
    # NOTE: written against jax.experimental.pallas.ops.tpu.flash_attention; not yet run on a TPU.
    from jax.experimental.pallas.ops.tpu.flash_attention import flash_attention
    if k.shape[2] != q.shape[2]:  # the kernel has no GQA: repeat the key/value heads
        k, v = (jnp.repeat(t, q.shape[2] // k.shape[2], axis=2) for t in (k, v))
    ab = None if bias is None else jnp.broadcast_to(bias, (q.shape[0], q.shape[2], q.shape[1], k.shape[1]))
    if mask is not None:
        hole = jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)
        ab = jnp.broadcast_to(hole, (q.shape[0], q.shape[2], q.shape[1], k.shape[1])) + (0 if ab is None else ab)
    out = flash_attention(*(jnp.swapaxes(t, 1, 2) for t in (q, k, v)), ab=ab, causal=is_causal, sm_scale=scale)
    return jnp.swapaxes(out, 1, 2)


_KERNELS: dict[str, tuple[str, Callable[..., jax.Array]]] = {"gpu": ("cudnn", _cudnn), "tpu": ("pallas", _pallas_tpu)}


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any, is_causal: bool,
            scale: float) -> jax.Array:
    """Attention in jax's ``[B, L, H, E]`` layout, on the default backend's fused kernel."""
    platform = jax.default_backend()
    name, fused = _KERNELS.get(platform, ("xla", _xla))
    if fused is _xla or refusal(platform, q.dtype.name, q.shape[-1]):  # counted where the op was recorded
        return _xla(q, k, v, mask, bias, is_causal, scale)
    try:
        return fused(q, k, v, mask, bias, is_causal, scale)
    except (ValueError, NotImplementedError, TypeError, RuntimeError) as error:
        warn_once(f"{name} refused the call ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})")
        return _xla(q, k, v, mask, bias, is_causal, scale)


def _mask4(m: Any) -> Any:
    return m if m is None or m.ndim == 4 else m.reshape((1,) * (4 - m.ndim) + m.shape)


def _in_torch_layout(mask: Any, bias: Any, is_causal: bool, scale: float,
                     ndim: int) -> Callable[[jax.Array, jax.Array, jax.Array], jax.Array]:
    """``(q, k, v) -> out`` in torch's layout (what the op's forward computes and differentiates)."""
    mask, bias = _mask4(mask), _mask4(bias)

    def f(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
        out = jnp.swapaxes(_attend(_bthd(q), _bthd(k), _bthd(v), mask, bias, is_causal, scale), 1, 2)
        return out[0] if ndim == 3 else out
    return f


@lowering(ATTENTION)
def _attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any, is_causal: bool,
               scale: float) -> jax.Array:
    out, vjp = jax.vjp(_in_torch_layout(mask, bias, is_causal, scale, q.ndim), q, k, v)
    if isinstance(out, _TRACER):  # inside a traced program: the backward may reuse the residuals
        _RESIDUALS[id(out)] = (out, vjp)
        while len(_RESIDUALS) > _RESIDUALS_CAP:
            _RESIDUALS.popitem(last=False)
    return out


@lowering(ATTENTION_BACKWARD)
def _attention_backward(grad: jax.Array, q: jax.Array, k: jax.Array, v: jax.Array, mask: Any, bias: Any,
                        out: jax.Array, is_causal: bool, scale: float) -> tuple[jax.Array, jax.Array, jax.Array]:
    saved = _RESIDUALS.pop(id(out), None)
    if saved is not None and saved[0] is out:
        return saved[1](grad.astype(out.dtype))
    f = _in_torch_layout(mask, bias, is_causal, scale, q.ndim)
    return jax.vjp(f, q, k, v)[1](grad.astype(q.dtype))
