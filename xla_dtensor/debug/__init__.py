"""Debugging aids: terminal visualization of shardings.

Example:
    >>> from xla_dtensor.debug import render_sharding
    >>> "│ 0 " in render_sharding("{devices=[2]<=[2]}", (4,), color=False).plain
    True
"""
from __future__ import annotations

from xla_dtensor.debug.layout import Cell, Grid, build_grid
from xla_dtensor.debug.visualize import render_sharding, visualize_sharding

__all__ = ["Cell", "Grid", "build_grid", "render_sharding", "visualize_sharding"]
