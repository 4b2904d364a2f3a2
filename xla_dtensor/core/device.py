"""The lazy device: PrivateUse1 renamed to ``jax`` through torch's Python-backend path.

``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` (torch
>= 2.5) renames PrivateUse1, generates ``Tensor.jax()`` / ``Module.jax()``, and
registers a Python device guard and hooks, which autograd needs for a backend without
C++ parts. ``"xla"`` is not usable: torch reserves it for torch_xla.

Example:
    >>> import torch, xla_dtensor
    >>> torch.zeros(2, device=xla_dtensor.device()).device.type
    'jax'
"""
from __future__ import annotations

import contextlib

import torch

DEVICE_NAME = "jax"
_registered = False


class DeviceRegistrationError(RuntimeError):
    """PrivateUse1 is already taken by another backend."""


class _BackendModule:
    """``torch.jax``: what torch asks of a PrivateUse1 backend module."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def current_device() -> int:
        return 0

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        from xla_dtensor import random
        random.manual_seed(seed)

    @staticmethod
    def manual_seed(seed: int) -> None:
        from xla_dtensor import random
        random.manual_seed(seed)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def synchronize(device: object = None) -> None:
        from xla_dtensor.core.executor import wait
        wait()

    # NOTE: one implicit stream (JAX orders the work); torch.distributed.checkpoint's writer asks for it
    @staticmethod
    def current_stream(device: object = None) -> _Stream:
        return _STREAM

    @staticmethod
    def stream(s: object) -> contextlib.nullcontext:
        return contextlib.nullcontext()


class _Stream:
    """The device's only stream: waiting on it waits for all dispatched work."""

    device_type = DEVICE_NAME

    def synchronize(self) -> None:
        _BackendModule.synchronize()

    def wait_stream(self, other: object) -> None:
        pass


_STREAM = _Stream()


def register() -> None:
    """Rename PrivateUse1 to ``jax`` once per process.

    Raises:
        DeviceRegistrationError: another library already renamed PrivateUse1.
    """
    global _registered
    if _registered:
        return
    current = torch._C._get_privateuse1_backend_name()
    if current != "privateuseone":
        raise DeviceRegistrationError(
            f"PrivateUse1 is already registered as {current!r} by another library; "
            f"xla_dtensor needs it for the {DEVICE_NAME!r} device (only one PrivateUse1 backend per process)")
    from torch.utils import backend_registration as br
    setup = getattr(br, "_setup_privateuseone_for_python_backend", None)
    if setup is None:  # pragma: no cover - torch < 2.5
        raise DeviceRegistrationError(f"torch {torch.__version__} lacks the Python PrivateUse1 backend path")
    setup(DEVICE_NAME, backend_module=_BackendModule())
    _registered = True


def device(index: int = 0) -> torch.device:
    """The lazy device, ``torch.device("jax", index)``.

    Example:
        >>> import xla_dtensor
        >>> xla_dtensor.device()
        device(type='jax', index=0)
    """
    if index != 0:
        raise ValueError(f"the jax device has one index (0); SPMD spreads it over all JAX devices, got {index}")
    return torch.device(DEVICE_NAME, 0)
