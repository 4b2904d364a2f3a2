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



def sharded_mlp(mode: str, model: Any, dev: torch.device) -> tuple[Any, Callable[[torch.Tensor], torch.Tensor]]:
    """``model`` (a ``Sequential`` of Linear, activation, Linear) laid out for ``mode`` over 8 devices, and
    the ``put`` for its batches (``(batch, seq, features)``): ``dp`` (batch split), ``megatron`` (2x4:
    the first layer split by rows, the second by columns, ``mark_sharding``), ``fsdp``, ``auto`` (2x4)."""
    import xla_dtensor.spmd as xs
    from xla_dtensor.fsdp import shard_model
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    if mode == "dp":
        return model.to(dev), sharded_batch(xs.Mesh(range(8), (8,), ("data",)), dev, ("data", None, None))
    if mode == "megatron":
        model.to(dev)
        xs.mark_sharding(model[0].weight, mesh, ("model", None))
        xs.mark_sharding(model[0].bias, mesh, ("model",))
        xs.mark_sharding(model[2].weight, mesh, (None, "model"))
        return model, sharded_batch(mesh, dev, ("data", None, None))
    if mode == "fsdp":
        return shard_model(model, xs.Mesh(range(8), (8,), ("fsdp",))), (lambda t: t.to(dev))
    if mode != "auto":
        raise ValueError(f"unknown mode {mode!r}; modes: dp, megatron, fsdp, auto")
    return xs.distribute_module(model, mesh, partition_fn=xs.AutoPolicy(time_limit=5, cache_dir=False)), \
        (lambda t: t.to(dev))


def mlp() -> torch.nn.Module:
    """The seeded ``Sequential`` of Linear(16, 32), GELU, Linear(32, 8) the sharded-MLP tests train."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))


MLP_BATCHES = [(torch.randn(8, 4, 16, generator=torch.Generator().manual_seed(s)),
                torch.randn(8, 4, 8, generator=torch.Generator().manual_seed(s + 50))) for s in range(3)]


def sharded_mlp_like_cpu(mode: str, dev: torch.device, counter: Callable[[], int]) -> tuple[Any, int]:
    """Train :func:`mlp` laid out for ``mode`` (:func:`sharded_mlp`) on :data:`MLP_BATCHES` with AdamW,
    assert its losses are torch CPU's; returns the model and how far ``counter()`` moved meanwhile."""
    import torch.nn.functional as F

    import xla_dtensor
    ref = mlp()
    want = train(lambda x, y: F.mse_loss(ref(x), y), MLP_BATCHES, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    model, put = sharded_mlp(mode, mlp(), dev)
    before = counter()
    got = train(lambda x, y: F.mse_loss(model(x), y), MLP_BATCHES,
                torch.optim.AdamW(model.parameters(), lr=1e-2), put=put, sync=xla_dtensor.sync)
    moved = counter() - before
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-4, atol=1e-6)
    return model, moved
