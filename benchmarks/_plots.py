"""Small plotting helpers shared by the benchmarks.

Example:
    >>> paired_bars  # doctest: +ELLIPSIS
    <function paired_bars at ...>
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence


def paired_bars(path: Path, labels: Sequence[str], first: Sequence[float], second: Sequence[float],
                names: tuple[str, str], ylabel: str, title: str, log: bool = False) -> None:
    """Save a bar chart of two series side by side per label (``names``: the legend)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(labels)), 3.5))
    x = range(len(labels))
    ax.bar([i - 0.2 for i in x], list(first), 0.4, label=names[0])
    ax.bar([i + 0.2 for i in x], list(second), 0.4, label=names[1])
    ax.set_xticks(list(x), list(labels))
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
