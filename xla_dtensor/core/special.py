"""Ops the core handles itself: device transfers, copies, aliases, scalars, factories."""
from __future__ import annotations

import operator
from typing import Any

import jax.numpy as jnp
import torch
from torch.library import Library

from xla_dtensor.core import native as _native
from xla_dtensor.core.dispatch import SPECIAL, dispatch, record
from xla_dtensor.core.dtypes import supported, to_jax
from xla_dtensor.core.executor import to_cpu, to_device
from xla_dtensor.core.ir import Node, make_node
from xla_dtensor.core.signature import roots_only
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, new_tensor, new_view, value_of, write

aten = torch.ops.aten
_CONVERT_FNS: dict[tuple, Any] = {}


def _convert(value: Node, src_meta: tuple, shape: tuple, dtype: torch.dtype) -> Node:
    """``value`` cast to ``dtype`` and broadcast to ``shape`` (identity when they match)."""
    if src_meta[0] == shape and src_meta[1] == dtype:
        return value
    key = ("convert", src_meta[0], src_meta[1], shape, dtype)
    fn = _CONVERT_FNS.get(key)
    if fn is None:
        jd = to_jax(dtype)
        fn = _CONVERT_FNS[key] = lambda x: jnp.broadcast_to(x.astype(jd), shape)
    return make_node("convert", key, hash(key), (value,), fn)


def _copy_(op: Any, args: tuple, kwargs: dict) -> Any:
    self, src = args[0], args[1]
    if not isinstance(self, LazyTensor):  # CPU destination, lazy source
        return self.copy_(to_cpu(src))
    torch.broadcast_shapes(tuple(src.shape), tuple(self.shape))  # torch's own error on bad shapes
    if isinstance(src, LazyTensor):
        value, meta = value_of(src), src._meta
    else:
        leaf = to_device(src)
        value, meta = leaf, (tuple(src.shape), src.dtype, None)
    write(self, _convert(value, meta, self._meta[0], self._meta[1]))
    return self


def _to_copy(op: Any, args: tuple, kwargs: dict) -> Any:
    self = args[0]
    dtype = kwargs.get("dtype") or self.dtype
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "jax":
        cpu = to_cpu(self)
        return cpu.to(device=device, dtype=dtype)
    if not supported(dtype):
        to_jax(dtype)
    if not isinstance(self, LazyTensor):  # host tensor to the device
        if self.numel() == 0 and device is not None:  # nothing to send: the program makes it (a KV cache's start)
            return aten.empty.memory_format(tuple(self.shape), dtype=dtype, device=device)
        host = self.detach().to(dtype).contiguous()
        return new_tensor((tuple(host.shape), dtype, tuple(host.stride())), to_device(host))
    meta = (self._meta[0], dtype, self._meta[2])
    return new_tensor(meta, _convert(value_of(self), self._meta, meta[0], dtype))


def _alias(op: Any, args: tuple, kwargs: dict) -> Any:
    t = args[0]
    return new_view(t._meta, t._storage, t._chain, value_of(t))


if _native.ON:  # the same in C: torch's AccumulateGrad detaches every gradient in every backward
    _alias = _native.MODULE.alias  # noqa: F811


def _item(op: Any, args: tuple, kwargs: dict) -> Any:
    return to_cpu(args[0]).item()


def _resize_(op: Any, args: tuple, kwargs: dict) -> Any:
    self, size = args[0], tuple(args[1])
    if size == tuple(self.shape):
        return self
    raise NotImplementedError(f"resize_ from {tuple(self.shape)} to {size} is not supported on the jax device")


def _inplace_view(op: Any, args: tuple, kwargs: dict) -> Any:
    """``squeeze_``, ``unsqueeze_``, ``t_``, ``transpose_``...: ``self`` becomes the out-of-place view of itself.

    The view is recorded as its out-of-place op (``transpose_`` -> ``transpose.int``) and ``self``
    takes its chain and metadata; the wrapper's own sizes and strides are set by the op's meta
    kernel run on it (no dispatch), as ``torch.utils._python_dispatch.return_and_correct_aliasing``
    does for wrapper subclasses. torch's ``matmul`` of a vector and a matrix ends in ``squeeze_``.
    """
    self = args[0]
    view = dispatch(_INPLACE_VIEWS[op], args, kwargs)
    self._chain, self._meta, self._vcache, self._seen = view._chain, view._meta, view._vcache, view._seen
    with torch.utils._mode_utils.no_dispatch():
        meta_in_tls = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            op(self, *args[1:], **kwargs)
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta_in_tls)
    return self


_INPLACE_VIEWS = {aten.squeeze_.default: aten.squeeze.default, aten.squeeze_.dim: aten.squeeze.dim,
                  aten.squeeze_.dims: aten.squeeze.dims, aten.unsqueeze_.default: aten.unsqueeze.default,
                  aten.t_.default: aten.t.default, aten.transpose_.default: aten.transpose.int}


def _native_batch_norm(op: Any, args: tuple, kwargs: dict) -> Any:
    # NOTE: native_batch_norm updates running_mean/var in place without saying so in its
    # schema; record the functional form and write the new statistics back explicitly.
    x, weight, bias, running_mean, running_var, training, momentum, eps = (*args, *kwargs.values())
    if running_mean is None or running_var is None:
        return dispatch(aten._native_batch_norm_legit.no_stats, (x, weight, bias, training, momentum, eps), {})
    if not training:
        return dispatch(aten._native_batch_norm_legit_no_training.default,
                        (x, weight, bias, running_mean, running_var, momentum, eps), {})
    out, mean, invstd, new_mean, new_var = dispatch(
        aten._native_batch_norm_legit_functional.default,
        (x, weight, bias, running_mean, running_var, True, momentum, eps), {})
    _copy_(aten.copy_.default, (running_mean, new_mean), {})
    _copy_(aten.copy_.default, (running_var, new_var), {})
    return out, mean, invstd


_META, _VALUE = operator.attrgetter("_meta"), operator.attrgetter("_storage.value")


def _foreach_add_scalar_(op: Any, args: tuple, kwargs: dict) -> Any:
    """``_foreach_add_(tensors, scalar)``; over 0-d root tensors that all hold one value (torch's
    per-parameter optimizer step counters, made alike and stepped together), recorded for the
    first alone and its new value written to every one.

    NOTE: the op over all of them recorded one node of ~200 inputs and ~200 outputs of which
    ``sync()`` kept one (``dispatch._shared_items``): ~0.4 ms of a 12-layer GPT's optimizer step.
    """
    targets = args[0]
    if kwargs or len(args) != 2 or type(targets) not in (list, tuple) or len(targets) < 2 \
            or not roots_only(targets) or targets[0]._meta[0] != () \
            or len(set(map(id, map(_VALUE, targets)))) != 1 or len(set(map(_META, targets))) != 1:
        return record(op, args, kwargs)
    first = targets[0]
    record(op, ([first], args[1]), {})
    value, owner = first._storage.value, STATE.owner
    for t in targets[1:]:
        write(t, value, owner)
    return None


SPECIAL.update({
    aten._foreach_add_.Scalar: _foreach_add_scalar_,
    aten.native_batch_norm.default: _native_batch_norm,
    aten.copy_.default: _copy_,
    aten._to_copy.default: _to_copy,
    aten.detach.default: _alias,
    aten.alias.default: _alias,
    aten.lift_fresh.default: _alias,
    aten._local_scalar_dense.default: _item,
    aten.resize_.default: _resize_,
    **{op: _inplace_view for op in _INPLACE_VIEWS},
})


def _factory(op: Any, *args: Any, **kwargs: Any) -> Any:
    dtype = kwargs.get("dtype")
    if dtype is not None and not supported(dtype):
        to_jax(dtype)
    return dispatch(op, args, kwargs)


_LIBS: list[Library] = []


def register_factories() -> None:
    """Route PrivateUse1 factory calls (``torch.empty(..., device="jax")`` etc.) to the core."""
    if _LIBS:
        return
    fallback = Library("_", "IMPL")
    fallback.fallback(_factory, dispatch_key="PrivateUse1")
    impls = Library("aten", "IMPL")
    for name in ("arange", "arange.start", "arange.start_step", "linspace", "eye", "eye.m", "randperm"):
        op_name, _, overload = name.partition(".")
        op = getattr(getattr(aten, op_name), overload or "default")
        impls.impl(name, lambda *a, _op=op, **k: _factory(_op, *a, **k), "PrivateUse1")
    # NOTE: torch.tensor(data, device=...) copies with the Python key excluded, landing here
    for name, op in (("copy_", aten.copy_.default), ("_to_copy", aten._to_copy.default)):
        impls.impl(name, lambda *a, _op=op, **k: SPECIAL[_op](_op, a, k), "PrivateUse1")
    _LIBS.extend([fallback, impls])
