"""Looking at layouts: the tensor visualizer and the compiled program's HLO."""
from __future__ import annotations

from typing import Any

from xla_dtensor.core.peer_errors import guard
from xla_dtensor.core.tensor import LazyTensor, is_view
from xla_dtensor.spmd import annotate as A


def visualize_tensor_sharding(t: LazyTensor, **kwargs: Any) -> Any:
    """Draw ``t``'s layout (annotated, or propagated after ``sync()``) in the terminal.

    Keyword arguments go to :func:`xla_dtensor.debug.visualize_sharding`. A layout not
    decided yet (a pending value nobody annotated) runs ``sync()`` first.

    Example:
        >>> import torch, xla_dtensor
        >>> from xla_dtensor.spmd import Mesh, mark_sharding
        >>> t = torch.zeros(8, 8, device=xla_dtensor.device())
        >>> _ = mark_sharding(t, Mesh(range(8), (4, 2)), (0, 1))
        >>> _ = visualize_tensor_sharding(t, width=30, color=False)  # doctest: +ELLIPSIS
        (0, 1) = {devices=[4,2]<=[8]} on global shape (8, 8)...
        ...7...
        ...
    """
    from xla_dtensor.debug import visualize_sharding
    from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor

    spec = XLAShardedTensor.wrap(t.detach())._known_spec()
    return visualize_sharding(spec.reduced(), tuple(t.shape), **kwargs)


def last_compiled_hlo() -> str:
    """HLO text of the executable the lazy core ran last (after SPMD partitioning).

    On a GPU or TPU, ``loss.backward()`` launches a lazy step's forward and backward as programs
    of their own (``xla_dtensor.config.launch_at_backward``), so after ``sync()`` this is the
    optimizer step's; set that option to ``False`` to see the whole step as one program.

    Example:
        >>> import torch, xla_dtensor
        >>> _ = (torch.ones(2, device=xla_dtensor.device()) * 2).cpu()
        >>> "HloModule" in last_compiled_hlo()
        True
    """
    from xla_dtensor.core import executor
    return executor.last_executable().as_text()


@guard
def to_host(t: LazyTensor) -> "np.ndarray":
    """The whole value of ``t`` as a numpy array, also when other processes hold parts of it.

    ``.cpu()`` / ``.item()`` need data this process can address; in a multi-process job a
    sharded or replicated global array may not be, so use this (a replicated value is
    read from a local replica; a sharded one is gathered over processes).

    Example:
        >>> import torch, xla_dtensor
        >>> to_host(torch.ones(2, device=xla_dtensor.device())).tolist()
        [1.0, 1.0]
    """
    import jax
    import numpy as np

    from xla_dtensor.core.executor import materialize
    from xla_dtensor.core.layout import padded_source
    from xla_dtensor.core.tensor import value_of
    src = padded_source(value_of(t)) if not is_view(t) else None
    arr = src.data if src is not None else materialize(t)
    if not isinstance(arr, jax.Array) or arr.is_fully_addressable:
        out = np.asarray(arr)
    elif arr.is_fully_replicated:
        out = np.asarray(arr.addressable_data(0))
    else:
        from jax.experimental import multihost_utils
        out = np.asarray(multihost_utils.process_allgather(arr, tiled=True))
    return out[tuple(slice(0, n) for n in t.shape)] if src is not None else out
