"""``torch_xla.distributed.parallel_loader``: ``MpDeviceLoader`` places each batch on the
device with its input sharding, a background thread prefetching host batches.

Each tensor of a batch (nested lists, tuples and dicts too) is sent shard by shard in
the layout of ``input_sharding`` (one :class:`ShardingSpec` for all tensors, or a dict
keyed like the batch); without one it is sent replicated.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.compat.torch_xla.distributed.spmd import Mesh, ShardingSpec, get_sharding_spec
    >>> spec = ShardingSpec(Mesh(range(8), (8,), ("data",)), ("data", None))
    >>> loader = MpDeviceLoader([torch.ones(16, 2)] * 3, xla_dtensor.device(), input_sharding=spec)
    >>> [get_sharding_spec(b) for b in loader][0]
    '{devices=[8,1]<=[8]}'
"""
from __future__ import annotations

import queue
import threading
from typing import Any, Iterable, Iterator

import torch

from xla_dtensor.compat.torch_xla.distributed.spmd._annotate import ShardingSpec
from xla_dtensor.core.tensor import LazyTensor

__all__ = ["MpDeviceLoader", "ParallelLoader"]

_DONE = object()


def _place(x: Any, sharding: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor) and not isinstance(x, LazyTensor):
        if isinstance(sharding, ShardingSpec) and sharding.can_apply(x):
            from xla_dtensor.spmd.api import distribute_tensor
            spec = sharding.spec_for(x.dim())
            out = distribute_tensor(x, spec.mesh, list(spec.to_placements()))
            return out.global_tensor
        return x.to(device)
    if isinstance(x, dict):
        return {k: _place(v, sharding.get(k) if isinstance(sharding, dict) else sharding, device)
                for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_place(v, sharding, device) for v in x)
    return x


class MpDeviceLoader:
    """Iterate ``loader``, each batch on ``device`` in the layout of ``input_sharding``.

    Args:
        loader: any iterable of batches (a ``DataLoader``).
        device: the ``jax`` device.
        input_sharding: a :class:`ShardingSpec`, or a dict of them keyed like dict batches.
        loader_prefetch_size: host batches a background thread reads ahead.
        device_prefetch_size: batches placed on the device ahead of the one returned.
    """

    def __init__(self, loader: Iterable[Any], device: torch.device, *, input_sharding: Any = None,
                 loader_prefetch_size: int = 8, device_prefetch_size: int = 4, **kwargs: Any) -> None:
        for name, v in (("loader_prefetch_size", loader_prefetch_size), ("device_prefetch_size", device_prefetch_size)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        self._loader, self._device, self._sharding = loader, device, input_sharding
        self._host_ahead, self._device_ahead = loader_prefetch_size, device_prefetch_size

    def __len__(self) -> int:
        return len(self._loader)  # type: ignore[arg-type]

    def _read(self, q: queue.Queue, stop: threading.Event) -> None:
        try:
            for batch in self._loader:
                while not stop.is_set():
                    try:
                        q.put(batch, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            q.put(_DONE)
        except BaseException as err:  # re-raised by the iterating thread
            q.put(err)

    def __iter__(self) -> Iterator[Any]:
        q: queue.Queue = queue.Queue(self._host_ahead)
        stop = threading.Event()
        threading.Thread(target=self._read, args=(q, stop), daemon=True, name="xla_dtensor-loader").start()
        ahead: list[Any] = []
        try:
            while True:
                while len(ahead) <= self._device_ahead:
                    item = q.get()
                    if item is _DONE:
                        break
                    if isinstance(item, BaseException):
                        raise item
                    ahead.append(_place(item, self._sharding, self._device))
                else:
                    yield ahead.pop(0)
                    continue
                yield from ahead
                return
        finally:
            stop.set()


class ParallelLoader:
    """torch_xla's ``ParallelLoader``: ``per_device_loader(device)`` is an :class:`MpDeviceLoader`."""

    def __init__(self, loader: Iterable[Any], devices: Any, **kwargs: Any) -> None:
        self._loader, self._kwargs = loader, kwargs

    def per_device_loader(self, device: torch.device) -> MpDeviceLoader:
        return MpDeviceLoader(self._loader, device, **self._kwargs)
