"""Op-lowering tests run with JAX x64 on (the lazy core enables it: torch's default int is int64)."""
from __future__ import annotations

import mesh  # noqa: F401  (virtual CPU devices before JAX starts)
import jax

jax.config.update("jax_enable_x64", True)
