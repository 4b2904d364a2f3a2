"""The lazy-graph core: device, lazy tensor, IR, recording, execution."""
from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)  # torch's default integer is int64

from xla_dtensor.core.device import (  # noqa: E402
    DEVICE_NAME, AutogradEngineWarning, DeviceRegistrationError, device, register,
)

register()

from xla_dtensor.core import special as _special  # noqa: E402
from xla_dtensor.core import data_dependent as _data_dependent  # noqa: E402,F401  (registers its handlers)
from xla_dtensor.core import index_checks as _index_checks  # noqa: E402
from xla_dtensor.core import autocast as _autocast  # noqa: E402,F401  (registers torch.autocast("jax") kernels)
from xla_dtensor.core import sdpa as _sdpa  # noqa: E402,F401  (routes F.scaled_dot_product_attention to a fused op)
from xla_dtensor.core import linear as _linear  # noqa: E402,F401  (routes F.linear to one op)
from xla_dtensor.core import fused_optim as _fused_optim  # noqa: E402
from xla_dtensor.core import attention_pattern as _attention_pattern  # noqa: E402,F401  (and softmax(q @ kᵀ) @ v)
from xla_dtensor.core.executor import mark_step, sync, wait  # noqa: E402
from xla_dtensor.core.tensor import LazyTensor  # noqa: E402

_special.register_factories()
_fused_optim.install()
_index_checks.install()  # after data_dependent: the checks wrap its index handlers

__all__ = ["AutogradEngineWarning", "DEVICE_NAME", "DeviceRegistrationError", "LazyTensor", "device", "mark_step", "sync", "wait"]
