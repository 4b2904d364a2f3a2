"""Several processes agree on one checkpoint through jax.distributed's key-value store.

No torch process group is needed: process 0 names the staging directory, every process
reports its part (JSON), process 0 merges, publishes and reports the outcome. Every
wait polls in short slices, so it stays interruptible (a peer-failure exception from
:mod:`xla_dtensor.runtime_dist` arrives in time) and ends after ``timeout`` seconds with
a :class:`CheckpointError` naming the processes that did not answer.

Example:
    >>> Coordinator.single().count
    1
"""
from __future__ import annotations

import hashlib
import itertools
import json
import time
from typing import Any

import jax

from xla_dtensor.checkpoint.errors import CheckpointError

_SEQ = itertools.count()
_SLICE_MS = 200


class Coordinator:
    """One save's exchange: ``rank``/``count`` and key-value helpers under a per-save prefix."""

    def __init__(self, rank: int, count: int, prefix: str, client: Any, timeout: float) -> None:
        self.rank, self.count, self.prefix, self.client, self.timeout = rank, count, prefix, client, timeout

    @classmethod
    def single(cls) -> Coordinator:
        return cls(0, 1, "", None, 0.0)

    @classmethod
    def for_save(cls, path: str, timeout: float) -> Coordinator:
        """The coordinator of this process's next save of ``path`` (every process counts its saves)."""
        if jax.process_count() == 1:
            return cls.single()
        from jax._src import distributed
        client = distributed.global_state.client
        if client is None:
            raise CheckpointError("several JAX processes but no jax.distributed client; "
                                  "start them with xla_dtensor.runtime.initialize_distributed")
        tag = hashlib.sha256(path.encode()).hexdigest()[:12]
        return cls(jax.process_index(), jax.process_count(), f"xla_dtensor/ckpt/{next(_SEQ)}/{tag}", client, timeout)

    def put(self, name: str, value: Any) -> None:
        self.client.key_value_set(f"{self.prefix}/{name}", json.dumps(value))

    def get(self, name: str, *, sender: int, what: str) -> Any:
        """The value ``name`` once process ``sender`` has set it (polled until the timeout)."""
        key = f"{self.prefix}/{name}"
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return json.loads(self.client.blocking_key_value_get(key, _SLICE_MS))
            except Exception as err:  # NOTE: jaxlib raises its own runtime error type for a timeout
                if "DEADLINE_EXCEEDED" not in str(err) and "timed out" not in str(err).lower():
                    raise
            if time.monotonic() > deadline:
                raise CheckpointError(f"process {sender} did not report {what} within {self.timeout:g} s "
                                      f"(is it alive and saving the same checkpoint?); nothing was published")

    def gather(self, name: str, value: Any, what: str) -> list[Any] | None:
        """Every process's ``value`` on process 0 (in process order); None elsewhere."""
        self.put(f"{name}/{self.rank}", value)
        if self.rank != 0:
            return None
        return [self.get(f"{name}/{r}", sender=r, what=what) for r in range(self.count)]
