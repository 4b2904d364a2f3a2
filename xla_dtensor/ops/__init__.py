"""aten -> JAX lowerings, one module per op family; importing this package registers them all.

Example:
    >>> import torch
    >>> from xla_dtensor.ops import get_lowering
    >>> get_lowering(torch.ops.aten.add.Tensor) is not None
    True
"""
from __future__ import annotations

from xla_dtensor.ops import (  # noqa: F401  (registration happens on import; order matters for foreach)
    activation, attention, binary, cast, complex, conv, counting, creation, elementwise, fused_attention, fused_linear,
    indexing, matmul, nn, optim, random, reduction, shape, sort,
)
from xla_dtensor.ops import foreach  # noqa: F401,E402  (after the elementwise families it loops over)
from xla_dtensor.ops.decomp import decomposed_lowering, missing_lowering_error, resolve  # noqa: E402
from xla_dtensor.ops.random import manual_seed, next_key  # noqa: E402
from xla_dtensor.ops.registry import (  # noqa: E402
    get_lowering, is_random, lowering, register_inplace_variants, registered_ops,
)

register_inplace_variants()

__all__ = [
    "decomposed_lowering", "get_lowering", "is_random", "lowering", "manual_seed", "missing_lowering_error",
    "next_key", "register_inplace_variants", "registered_ops", "resolve",
]
