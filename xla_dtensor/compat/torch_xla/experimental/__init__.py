"""``torch_xla.experimental``: :mod:`.distributed_checkpoint`, :mod:`.spmd_fully_sharded_data_parallel`."""
from __future__ import annotations
