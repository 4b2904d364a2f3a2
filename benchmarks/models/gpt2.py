"""GPT-2-style model for benchmarks and tests; defined in :mod:`autoshard.models`.

It lives in ``autoshard`` so that ``python -m autoshard plan --model gpt2`` can build
it without importing ``benchmarks`` (imports go mesh <- autoshard <- xla_dtensor <- benchmarks).

Example:
    >>> from benchmarks.models.gpt2 import GPT2, GPT2Config
    >>> GPT2(GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)).cfg.n_layer
    1
"""
from __future__ import annotations

from autoshard.models import GPT2, MLP, Attention, Block, GPT2Config

__all__ = ["GPT2", "GPT2Config", "Attention", "Block", "MLP"]
