"""The training loop the numerics tests share: one optimizer step per batch, losses back.

Example:
    >>> import torch
    >>> m = torch.nn.Linear(2, 1)
    >>> loss_of = lambda x: m(x).square().mean()
    >>> len(train(loss_of, [(torch.ones(3, 2),)] * 2, torch.optim.SGD(m.parameters(), lr=0.1)))
    2
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch


def train(model: Callable[..., torch.Tensor], batches: Iterable[Sequence[Any]], opt: torch.optim.Optimizer, *,
          put: Callable[[torch.Tensor], torch.Tensor] | None = None,
          after_step: Callable[[int], None] | None = None,
          sync: Callable[[], None] | None = None) -> list[float]:
    """Losses of ``model(*batch)`` over ``batches``, with backward and ``opt.step()`` after each.

    ``put`` maps each batch tensor first (``.to(dev)``, a sharding); ``after_step(i)`` runs
    after step ``i``'s ``opt.step()`` and before ``zero_grad``; ``sync`` ends each step
    (``xla_dtensor.sync``) before its loss is read.
    """
    losses = []
    for step, batch in enumerate(batches):
        if put is not None:
            batch = [put(t) for t in batch]
        loss = model(*batch)
        loss.backward()
        opt.step()
        if after_step is not None:
            after_step(step)
        opt.zero_grad()
        if sync is not None:
            sync()
        losses.append(loss.item())
    return losses


def sharded_batch(mesh: Any, dev: torch.device, spec: tuple = ("data", None)) -> Callable[[torch.Tensor], torch.Tensor]:
    """A ``put`` for :func:`train`: each batch tensor moved to ``dev`` and split by ``spec`` over ``mesh``."""
    import xla_dtensor.spmd as xs

    def put(t: torch.Tensor) -> torch.Tensor:
        t = t.to(dev)
        xs.mark_sharding(t, mesh, spec)
        return t
    return put

