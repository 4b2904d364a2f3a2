"""Looking at layouts: the tensor visualizer and the compiled program's HLO."""
from __future__ import annotations

from typing import Any

from xla_dtensor.core.tensor import LazyTensor
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
        {devices=[4,2]<=[8]} ...
    """
    from xla_dtensor.debug import visualize_sharding
    from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor

    spec = XLAShardedTensor.wrap(t.detach())._known_spec()
    return visualize_sharding(spec.reduced(), tuple(t.shape), **kwargs)


def last_compiled_hlo() -> str:
    """HLO text of the executable the lazy core ran last (after SPMD partitioning).

    Example:
        >>> import torch, xla_dtensor
        >>> _ = (torch.ones(2, device=xla_dtensor.device()) * 2).cpu()
        >>> "HloModule" in last_compiled_hlo()
        True
    """
    from xla_dtensor.core import executor
    if not executor._CACHE:
        raise LookupError("no program has been compiled yet")
    return next(reversed(executor._CACHE.values())).as_text()
