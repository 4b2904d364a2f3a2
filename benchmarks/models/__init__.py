"""Plain torch.nn models shared by benchmarks and tests."""
from __future__ import annotations

from benchmarks.models.gpt2 import GPT2, GPT2Config

__all__ = ["GPT2", "GPT2Config"]
