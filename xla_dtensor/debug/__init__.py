"""Debugging aids: terminal visualization of shardings.

Example:
    >>> from xla_dtensor.debug import render_sharding
    >>> print(render_sharding("{devices=[2]<=[2]}", (4,), width=13, color=False).plain)
    {devices=[2]<=[2]} on global shape (4,)
    ┌─────┬─────┐
    │  0  │  1  │
    └─────┴─────┘
"""
from __future__ import annotations

from xla_dtensor.debug.layout import Cell, Grid, build_grid
from xla_dtensor.debug.visualize import render_sharding, visualize_sharding

__all__ = ["Cell", "Grid", "build_grid", "render_sharding", "visualize_sharding"]
