"""Process-level SPMD runtime: device counts, ``use_spmd``, the 1-D mesh, multi-process start.

Re-exported by :mod:`xla_dtensor.runtime_dist` (and ``xla_dtensor.runtime`` where present).
"""
from __future__ import annotations

import logging
import os
from typing import Any

import jax

from mesh import Mesh

_log = logging.getLogger("xla_dtensor.spmd")
_SPMD = {"on": True}


def use_spmd(auto: bool = False) -> None:
    """Switch SPMD on (torch_xla compatibility). Here every program is SPMD over all JAX
    devices already, so this only checks the argument.

    Example:
        >>> use_spmd()
    """
    if auto:
        raise NotImplementedError("use_spmd(auto=True) is the auto-sharder's switch; use "
                                  "distribute_module(..., partition_fn='AUTO') once it lands")
    _SPMD["on"] = True


def is_spmd() -> bool:
    return _SPMD["on"]


def global_runtime_device_count() -> int:
    """Devices in all processes (``jax.device_count()``)."""
    return jax.device_count()


def addressable_runtime_device_count() -> int:
    """Devices this process drives (``jax.local_device_count()``)."""
    return jax.local_device_count()


def process_index() -> int:
    return jax.process_index()


def process_count() -> int:
    return jax.process_count()


def get_1d_mesh(axis_name: str | None = None) -> Mesh:
    """All devices on one axis, in device-id order.

    Example:
        >>> get_1d_mesh("data").shape()
        OrderedDict([('data', 8)])
    """
    ids = sorted(d.id for d in jax.devices())
    return Mesh(ids, (len(ids),), (axis_name,) if axis_name else None)


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, *, local_device_ids: Any = None,
                           cpu_collectives: str | None = "gloo", **kwargs: Any) -> None:
    """Join a multi-process job (``jax.distributed.initialize``); call before any JAX work.

    On CPU devices the cross-process collectives need an implementation: ``"gloo"``
    (default) sets ``jax_cpu_collectives_implementation``. Arguments default to the
    ``XLA_DTENSOR_COORDINATOR`` / ``XLA_DTENSOR_NUM_PROCESSES`` / ``XLA_DTENSOR_PROCESS_ID``
    environment variables, then to JAX's own detection (cluster environments).

    Example:
        >>> initialize_distributed("127.0.0.1:12345", 2, 0)  # doctest: +SKIP
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("XLA_DTENSOR_COORDINATOR")
    if num_processes is None and "XLA_DTENSOR_NUM_PROCESSES" in env:
        num_processes = int(env["XLA_DTENSOR_NUM_PROCESSES"])
    if process_id is None and "XLA_DTENSOR_PROCESS_ID" in env:
        process_id = int(env["XLA_DTENSOR_PROCESS_ID"])
    if cpu_collectives:
        jax.config.update("jax_cpu_collectives_implementation", cpu_collectives)
    jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                               process_id=process_id, local_device_ids=local_device_ids, **kwargs)
    _log.info("joined process %d of %d: %d local / %d global devices", jax.process_index(),
              jax.process_count(), jax.local_device_count(), jax.device_count())
