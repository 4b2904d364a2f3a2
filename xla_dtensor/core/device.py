"""The lazy device: PrivateUse1 renamed to ``jax`` through torch's Python-backend path.

``torch.utils.backend_registration._setup_privateuseone_for_python_backend`` (torch
>= 2.5) renames PrivateUse1, generates ``Tensor.jax()`` / ``Module.jax()``, and
registers a device guard and hooks, which autograd needs for a backend without C++
parts. The guard is the core's C++ one (``_cxx.register_device_guard``) where the C++
part is built, else a Python one. ``"xla"`` is not usable: torch reserves it for torch_xla.

Import order: torch's autograd engine sizes its per-device ready queues once, at the
first ``backward()`` of the process. If one ran before this registration the engine has
no queue for the ``jax`` device; :func:`check_autograd_engine` finds that out at import
and sends the importing thread's backward through the caller's queue instead
(``torch.autograd.set_multithreading_enabled(False)``, torch's documented switch; any
other thread gets it at its first op on the device), with an :class:`AutogradEngineWarning`.

Example:
    >>> import torch, xla_dtensor
    >>> torch.zeros(2, device=xla_dtensor.device()).device.type
    'jax'
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import warnings

import torch

from xla_dtensor.core.state import STATE

DEVICE_NAME = "jax"
_registered = False


class DeviceRegistrationError(RuntimeError):
    """PrivateUse1 is already taken by another backend."""


class AutogradEngineWarning(UserWarning):
    """A ``backward()`` ran before the ``jax`` device was registered (see :func:`check_autograd_engine`)."""


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


class _DeviceGuard(torch._C._acc.DeviceGuard):
    """torch's Python device guard for PrivateUse1 (without the core's C++ part), whose only
    Python method is ``type_``.

    torch's autograd and dispatcher ask the guard its device type ~4 times per backward op
    (2,480 times in a 12-layer GPT step). ``type_`` is a C-level callable here, not a Python
    function (torch's default guard's), so each ask makes no Python frame.
    """

    type_ = itertools.repeat(torch._C._autograd.DeviceType.PrivateUse1).__next__


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
    from xla_dtensor.core import cxx
    if cxx.MODULE is not None:  # torch keeps the first guard: setup's Python one is then unused
        cxx.MODULE.register_device_guard()
    setup(DEVICE_NAME, backend_module=_BackendModule(), device_guard=_DeviceGuard())
    _registered = True
    check_autograd_engine()


_QUEUE_ASSERT = "device_ready_queues_"  # torch's internal assert when a device has no queue


class _Probe(torch.Tensor):
    """A data-less tensor on the jax device: the engine only reads its metadata."""

    @staticmethod
    def __new__(cls) -> "_Probe":
        return torch.Tensor._make_wrapper_subclass(cls, (), device=torch.device(DEVICE_NAME, 0))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        raise RuntimeError(f"the autograd engine probe ran an op: {func}")


class _ProbeFn(torch.autograd.Function):
    """One backward node whose incoming gradient lives on the jax device."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        return _Probe()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> None:  # noqa: ANN001
        return None


def _engine_has_queue() -> bool:
    """Run one backward node queued on the jax device (no op, no JAX; < 1 ms)."""
    out = _ProbeFn.apply(torch.zeros((), requires_grad=True))
    try:  # the engine directly: torch.autograd.backward would import sympy first
        torch.autograd.Variable._execution_engine.run_backward(
            (out,), (_Probe(),), False, False, (), True, True)
    except RuntimeError as err:
        if _QUEUE_ASSERT not in str(err):
            raise
        return False
    return True


def check_autograd_engine() -> bool:
    """Make ``backward()`` on the jax device work whatever ran before ``import xla_dtensor``.

    torch's autograd engine creates one ready queue per accelerator index at the first
    backward of the process. When that happened before the ``jax`` device existed (a CPU
    reference computed first, ``autoshard.trace_training_step``, a notebook cell), the
    first backward on the device would die on an internal assert. If the probe finds no
    queue, this thread's backward runs on the calling thread's queue
    (``torch.autograd.set_multithreading_enabled(False)``) and an
    :class:`AutogradEngineWarning` names the cause and what other threads must do.
    If the engine has no queue yet, the probe starts it with one for the device.

    Returns:
        True if the engine already had a queue for the device.

    Raises:
        DeviceRegistrationError: backward on the device cannot work even on this thread.

    Example:
        >>> check_autograd_engine()
        True
    """
    if _engine_has_queue():
        return True
    torch.autograd.set_multithreading_enabled(False)
    if not _engine_has_queue():  # pragma: no cover - a torch whose engine ignores the switch
        raise DeviceRegistrationError(
            "a backward() ran before `import xla_dtensor`, so torch's autograd engine has no "
            f"queue for the {DEVICE_NAME!r} device; import xla_dtensor before the first backward")
    STATE.no_queue = True  # each thread's first op switches the engine's threading off (core.threads)
    warnings.warn(
        "a backward() ran before `import xla_dtensor`: torch's autograd engine sized its "
        f"per-device queues without the {DEVICE_NAME!r} device. Backward on the device now runs "
        "on the thread that calls it (torch.autograd.set_multithreading_enabled(False), set here, "
        "and in any other thread at its first op on the device). A thread whose first device op is "
        "backward() itself must wrap it in `with torch.autograd.set_multithreading_enabled(False):`; "
        "or import xla_dtensor before the first backward of the process",
        AutogradEngineWarning, stacklevel=2)
    return False


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


@functools.cache
def platform() -> str:
    """Where the device's programs run: jax's default backend (``"cpu"``, ``"gpu"``, ``"tpu"``), read once.

    Example:
        >>> from xla_dtensor.core.device import platform
        >>> platform() in ("cpu", "gpu", "tpu")
        True
    """
    import jax
    return jax.default_backend()
