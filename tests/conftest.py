"""Shared test setup: 8 virtual CPU devices, and caches kept out of the user's home."""
from __future__ import annotations

import os
import tempfile

# Plans and compiled programs land in a per-run temporary folder, so tests neither read
# a developer's cache nor leave files behind (subprocesses inherit the variable).
os.environ.setdefault("XLA_DTENSOR_CACHE_DIR", tempfile.mkdtemp(prefix="xla_dtensor_test_cache_"))

import mesh  # noqa: E402,F401  (must precede any jax import: sets the virtual device count)
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def dev():
    """The lazy ``jax`` torch device."""
    import xla_dtensor
    return xla_dtensor.device()
