"""The AUTO sharding policy's pieces: the lazy IR as an autoshard graph.

Example:
    >>> from xla_dtensor.auto import graph_from_ir, pending_storages, step_roles  # doctest: +SKIP
    >>> params, state = step_roles(model, optimizer)  # doctest: +SKIP
    >>> plan = autoshard.solve(graph_from_ir(params=params, opt_state=state), mesh)  # doctest: +SKIP
"""
from __future__ import annotations

from xla_dtensor.core.ir_args import ScalarParam
from xla_dtensor.auto.ir_graph import graph_from_ir, pending_storages, step_roles

__all__ = ["ScalarParam", "graph_from_ir", "pending_storages", "step_roles"]
