"""Shared test setup: import mesh first so JAX starts with 8 virtual CPU devices."""
from __future__ import annotations

import mesh  # noqa: F401  (must precede any jax import)
import pytest


@pytest.fixture(scope="session")
def dev():
    """The lazy ``jax`` torch device."""
    import xla_dtensor
    return xla_dtensor.device()
