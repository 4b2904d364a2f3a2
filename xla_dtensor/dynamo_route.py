"""``torch.compile(model)`` (the default backend) on ``jax`` tensors: routed to ``backend="xla_dtensor"``.

torch's default backend, inductor, generates Triton or C++ code for CUDA and CPU tensors;
it has no code generator for the ``jax`` device. A graph whose inputs include ``jax``
tensors is therefore compiled by :func:`xla_dtensor.dynamo_backend.xla_dtensor_backend`
(the same as ``torch.compile(model, backend="xla_dtensor")``), with a one-time
:class:`RoutedToXlaDtensorWarning` naming it; inductor's ``mode``/``options`` do not
apply there. Graphs on CPU or CUDA tensors are inductor's as before.
``set_routing(False)`` makes such a call raise :class:`InductorDeviceError`
instead.

Example:
    >>> import torch, xla_dtensor
    >>> f = torch.compile(lambda x: x * 2, backend="xla_dtensor")
    >>> f(torch.ones(2, device=xla_dtensor.device())).tolist()
    [2.0, 2.0]
"""
from __future__ import annotations

import warnings
from typing import Any, Callable

import torch

__all__ = ["InductorDeviceError", "RoutedToXlaDtensorWarning", "install", "set_routing"]

_STATE = {"warned": False, "route": True}


class RoutedToXlaDtensorWarning(UserWarning):
    """A default-backend ``torch.compile`` graph on ``jax`` tensors was compiled by ``xla_dtensor``."""


class InductorDeviceError(RuntimeError):
    """Inductor was asked to compile a graph on ``jax`` tensors with routing switched off."""


def _has_jax_tensor(inputs: Any) -> bool:
    from xla_dtensor.core.tensor import LazyTensor
    return any(isinstance(x, LazyTensor) for x in inputs)


def set_routing(enabled: bool) -> None:
    """Route default-backend graphs on ``jax`` tensors to ``xla_dtensor`` (default), or raise."""
    _STATE["route"] = bool(enabled)


def _routed(call: Callable[..., Any]) -> Callable[..., Any]:
    def __call__(self: Any, model_: Any, inputs_: Any, **kwargs: Any) -> Any:
        if not _has_jax_tensor(inputs_):
            return call(self, model_, inputs_, **kwargs)
        if not _STATE["route"]:
            raise InductorDeviceError(
                "torch.compile's default backend (inductor) cannot generate code for tensors on the "
                "jax device; use torch.compile(model, backend='xla_dtensor')")
        if not _STATE["warned"]:
            _STATE["warned"] = True
            warnings.warn(RoutedToXlaDtensorWarning(
                "torch.compile: inputs on the jax device are compiled by backend='xla_dtensor' (inductor has "
                "no code generator for them; its mode/options are ignored); pass backend='xla_dtensor' to "
                "silence this"), stacklevel=2)
        from xla_dtensor.dynamo_backend import xla_dtensor_backend
        return xla_dtensor_backend(model_, inputs_)
    __call__._xdt_routed = True  # type: ignore[attr-defined]
    return __call__


def install() -> None:
    """Wrap torch's inductor entry point once (``import xla_dtensor`` does it)."""
    wrapper = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper is None or getattr(wrapper.__call__, "_xdt_routed", False):
        return
    wrapper.__call__ = _routed(wrapper.__call__)
