"""xla-dtensor: DTensor-native SPMD sharding for PyTorch, compiled by XLA through JAX."""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (sets the virtual CPU device default before JAX starts)

__version__ = "0.1.0"
