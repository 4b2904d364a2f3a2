"""``torch_xla.core``: :mod:`.xla_model`."""
from __future__ import annotations
