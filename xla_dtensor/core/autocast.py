"""Mixed precision on the ``jax`` device: ``torch.autocast(device_type="jax", dtype=...)``.

torch's autocast is a dispatch key per device (``AutocastPrivateUse1`` for ours). torch
registers kernels for it on CPU, CUDA, XPU, MPS and the rest in C++, but none for
PrivateUse1: a backend is expected to register its own (C++ ``KERNEL_PRIVATEUSEONE``).
Without them every op under ``torch.autocast("jax")`` fails with "Could not run ...
with arguments from the 'Autocastjax' backend". At import this module registers:

* a fallthrough for the key, so ops outside the lists run unchanged;
* one Python kernel per op of CUDA's lists (the same op names and cast policies
  ``aten/src/ATen/autocast_mode.cpp`` registers for ``AutocastCUDA``):

  - ``LOWER_PRECISION``: matmuls, linear, convolutions, RNN cells, SDPA run in the
    autocast dtype (``torch.get_autocast_dtype("jax")``);
  - ``FP32``: pointwise math that loses range (exp, log, pow, ...), norms, losses in float32;
  - ``FP32_SET_OPT_DTYPE``: softmax, log_softmax, sum, prod, cumsum, vector norms get
    ``dtype=torch.float32`` unless the caller gave one;
  - ``FP32_APPEND_DTYPE``: ``norm`` redispatched to its overload with a dtype, float32;
  - ``PROMOTE``: multi-input ops run in the widest floating dtype among their inputs;
  - ``binary_cross_entropy`` raises CUDA's "unsafe to autocast" error.

A tensor is cast when it is floating point, on the ``jax`` device and not float64, as
torch's ``cached_cast`` decides. The op then runs with the autocast key excluded, so the
lazy core records the casts and the op in the lower precision: lazy mode,
``xla_dtensor.compile``, eager mode, AUTO and every sharding see the same graph.

Differences from CUDA: torch caches the low-precision copy of a leaf parameter within an
autocast region; here each use records its own cast, which the lazy graph's
hash-consing and XLA's common-subexpression pass merge. An unsupported dtype given to
``torch.autocast("jax", ...)`` is refused by torch itself (a warning naming float16 and
bfloat16, autocast disabled); one set directly with ``torch.set_autocast_dtype`` raises
:class:`AutocastDtypeError` at the first autocast op.

Example:
    >>> import torch, xla_dtensor
    >>> lin = torch.nn.Linear(4, 2).to(xla_dtensor.device())
    >>> x = torch.ones(3, 4, device=xla_dtensor.device())
    >>> with torch.autocast("jax", dtype=torch.bfloat16):
    ...     y = lin(x)
    ...     p = y.softmax(-1)
    >>> y.dtype, p.dtype, lin(x).dtype
    (torch.bfloat16, torch.float32, torch.float32)
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from xla_dtensor.core.device import DEVICE_NAME

KEY = "AutocastPrivateUse1"
SUPPORTED: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16)  # = torch.jax.get_amp_supported_dtype()

# NOTE: CUDA's lists in torch 2.13 (every op torch registers for AutocastCUDA, by policy);
# tests/xla_dtensor/core/test_autocast.py checks the union against the dispatcher's
# AutocastCUDA registrations and the policies against CUDA's own kernels.
LOWER_PRECISION: tuple[str, ...] = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution", "prelu",
    "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear", "addbmm",
    "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention", "cudnn_convolution",
    "cudnn_convolution_transpose",
)
FP32: tuple[str, ...] = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p", "reciprocal",
    "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "softplus",
    "layer_norm", "native_layer_norm", "group_norm", "rms_norm", "frobenius_norm.dim", "nuclear_norm",
    "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss", "cosine_embedding_loss", "nll_loss",
    "nll_loss2d", "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss",
    "mse_loss", "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss",
    "triplet_margin_loss", "multi_margin_loss", "binary_cross_entropy_with_logits", "dist", "pdist",
    "cdist", "renorm", "logsumexp", "upsample_nearest1d", "_upsample_nearest_exact1d",
    "upsample_nearest2d", "_upsample_nearest_exact2d", "upsample_nearest3d",
    "_upsample_nearest_exact3d", "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
)
FP32_SET_OPT_DTYPE: tuple[str, ...] = (
    "prod", "prod.dim_int", "softmax.int", "log_softmax.int", "cumprod", "cumsum", "linalg_vector_norm",
    "linalg_matrix_norm", "linalg_matrix_norm.str_ord", "sum", "sum.dim_IntList",
)
FP32_APPEND_DTYPE: dict[str, str] = {  # op -> the overload it redispatches to, with dtype=float32
    "norm.Scalar": "norm.ScalarOpt_dtype", "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype"}
PROMOTE: tuple[str, ...] = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler", "index_put",
    "tensordot", "scatter_add",
)
BANNED: tuple[str, ...] = ("binary_cross_entropy",)

_BCE_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")


class AutocastDtypeError(RuntimeError):
    """Autocast on the ``jax`` device was given a dtype it cannot cast to."""


_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_F32 = torch.float32
_F64 = torch.float64


def lower_dtype() -> torch.dtype:
    """The autocast dtype of the ``jax`` device, checked.

    Raises:
        AutocastDtypeError: it is not float16 or bfloat16 (set by ``torch.set_autocast_dtype``;
            ``torch.autocast`` itself refuses other dtypes with a warning).

    Example:
        >>> with torch.autocast("jax", dtype=torch.bfloat16):
        ...     lower_dtype()
        torch.bfloat16
    """
    dtype = torch.get_autocast_dtype(DEVICE_NAME)
    if dtype not in SUPPORTED:
        raise AutocastDtypeError(
            f"autocast on the {DEVICE_NAME!r} device casts to {', '.join(map(str, SUPPORTED))}; "
            f"torch.get_autocast_dtype({DEVICE_NAME!r}) is {dtype}")
    return dtype


def state() -> torch.dtype | None:
    """The autocast dtype while autocast is on for the device, else None (part of a compiled call's signature).

    Example:
        >>> state() is None
        True
    """
    return torch.get_autocast_dtype(DEVICE_NAME) if torch.is_autocast_enabled(DEVICE_NAME) else None


def _eligible(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype is not _F64 \
        and t.device.type == DEVICE_NAME


def _cast(x: Any, dtype: torch.dtype) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.dtype is not dtype and _eligible(x) else x
    if isinstance(x, (list, tuple)):  # Tensor[] and Tensor?[] arguments
        return type(x)(_cast(v, dtype) for v in x)
    return x


def _cast_all(args: tuple, kwargs: dict, dtype: torch.dtype) -> tuple[tuple, dict]:
    return tuple(_cast(a, dtype) for a in args), {k: _cast(v, dtype) for k, v in kwargs.items()}


def _promote(current: torch.dtype, x: Any) -> torch.dtype:
    """torch's ``prioritize``: float32 wins over the lower dtype; float64 and non-device tensors are ignored."""
    if isinstance(x, (list, tuple)):
        for v in x:
            current = _promote(current, v)
        return current
    if not _eligible(x) or x.dtype is current or current is _F32:
        return current
    if x.dtype is _F32:
        return _F32
    raise AutocastDtypeError(
        f"autocast promotion on the {DEVICE_NAME!r} device met {x.dtype} beside {current}: "
        f"expected float32 or the autocast dtype {current} (torch's CUDA autocast refuses this too)")


def _float32() -> torch.dtype:
    return _F32


def _casting(op: Any, target: Callable[[], torch.dtype]) -> Callable[..., Any]:
    """The kernel of a LOWER_PRECISION (``target=lower_dtype``) or FP32 (``target=_float32``) op."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        args, kwargs = _cast_all(args, kwargs, target())
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _promoting(op: Any) -> Callable[..., Any]:
    def kernel(*args: Any, **kwargs: Any) -> Any:
        dtype = lower_dtype()
        for a in (*args, *kwargs.values()):
            dtype = _promote(dtype, a)
        args, kwargs = _cast_all(args, kwargs, dtype)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            return op(*args, **kwargs)
    return kernel


def _dtype_position(op: Any) -> int | None:
    """Where ``op`` takes ``dtype`` positionally (None: keyword-only)."""
    for i, arg in enumerate(op._schema.arguments):
        if arg.name == "dtype":
            return None if arg.kwarg_only else i
    raise ValueError(f"{op} has no dtype argument")


def _set_opt_dtype(op: Any) -> Callable[..., Any]:
    pos = _dtype_position(op)

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            given = kwargs.get("dtype") if pos is None or pos >= len(args) else args[pos]
            if given is None and args and _eligible(args[0]):  # CUDA: only when the first argument is eligible
                if pos is not None and pos < len(args):
                    args = args[:pos] + (_F32,) + args[pos + 1:]
                else:
                    kwargs = {**kwargs, "dtype": _F32}
            return op(*args, **kwargs)
    return kernel


def _append_dtype(op: Any, target: Any) -> Callable[..., Any]:
    names = [a.name for a in op._schema.arguments]
    defaults = {a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}

    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            if not (args and _eligible(args[0])):
                return op(*args, **kwargs)
            full = [args[i] if i < len(args) else kwargs.get(n, defaults.get(n)) for i, n in enumerate(names)]
            return target(*full, dtype=_F32)
    return kernel


def _banned(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError(_BCE_MESSAGE)


def _overload(name: str) -> Any:
    packet, _, overload = name.partition(".")
    return getattr(getattr(torch.ops.aten, packet), overload or "default")


def _registrations() -> list[tuple[str, Callable[..., Any]]]:
    regs = [(n, _casting(_overload(n), lower_dtype)) for n in LOWER_PRECISION]
    regs += [(n, _casting(_overload(n), _float32)) for n in FP32]
    regs += [(n, _set_opt_dtype(_overload(n))) for n in FP32_SET_OPT_DTYPE]
    regs += [(n, _append_dtype(_overload(n), _overload(t))) for n, t in FP32_APPEND_DTYPE.items()]
    regs += [(n, _promoting(_overload(n))) for n in PROMOTE]
    return regs + [(n, _banned) for n in BANNED]


_LIBS: list[torch.library.Library] = []  # kept alive: a registration lives as long as its library


def register() -> None:
    """Register the fallthrough and the per-op kernels for ``AutocastPrivateUse1`` (once per process).

    Example:
        >>> register()  # already done by ``import xla_dtensor``; a second call does nothing
        >>> torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", "AutocastPrivateUse1")
        True
    """
    if _LIBS:
        return
    fallback = torch.library.Library("_", "IMPL")  # noqa: TOR901
    fallback.fallback(torch.library.fallthrough_kernel, KEY)
    kernels = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    for name, kernel in _registrations():
        kernels.impl(name, kernel, KEY)
    _LIBS.extend((fallback, kernels))


register()
