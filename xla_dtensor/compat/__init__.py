"""Compatibility layers for code written against other libraries' APIs.

``xla_dtensor.compat.torch_xla`` maps PyTorch/XLA's SPMD user API onto this project
under the same module paths (see docs/migrating_from_torch_xla.md).
"""
from __future__ import annotations
