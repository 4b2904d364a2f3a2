"""``torch_xla.distributed``: :mod:`.spmd` and :mod:`.parallel_loader`."""
from __future__ import annotations
