"""Counters of the lazy core: compiles, cache hits, executions, transfers, CPU fallbacks.

Example:
    >>> import xla_dtensor
    >>> xla_dtensor.metrics.reset()
    >>> xla_dtensor.metrics.counters()["compiles"]
    0
"""
from __future__ import annotations

from collections import Counter

__all__ = ["counters", "reset", "snapshot", "diff", "NAMES"]

NAMES = (
    "compiles",          # XLA executables built
    "cache_hits",        # sync()s served by a cached executable
    "executions",        # executables run
    "transfers_to_device",
    "transfers_to_host",
    "cpu_fallbacks",     # ops run on CPU because they lack a lowering
    "signature_misses",  # new (op, argument signature): shape inference ran
    "ops_recorded",      # IR nodes created
    "hash_cons_hits",    # ops that found an identical existing node
    "plans_reused",      # sync()s whose plan came from an identical earlier recording (core.plan_cache)
    "fused_attention",   # attention calls recorded as one fused attention op (xla_dtensor.ops.fused_attention)
    "fused_attention_fallbacks",  # of those, lowered with XLA's math where the GPU/TPU kernel refused them
    "fused_linear",      # F.linear calls recorded as one op (xla_dtensor.core.linear)
    "fused_linear_backward",  # their gradients recorded as one op (the same module)
)

_COUNTS: Counter[str] = Counter({name: 0 for name in NAMES})


def incr(name: str, n: int = 1) -> None:
    """Add ``n`` to counter ``name`` (internal)."""
    _COUNTS[name] += n


def counters() -> dict[str, int]:
    """A copy of all counters."""
    return dict(_COUNTS)


def snapshot() -> dict[str, int]:
    """Alias of :func:`counters`, for use with :func:`diff`."""
    return counters()


def diff(before: dict[str, int]) -> dict[str, int]:
    """Counter increments since ``before`` (a :func:`snapshot`).

    Example:
        >>> s = snapshot(); diff(s)["compiles"]
        0
    """
    return {k: v - before.get(k, 0) for k, v in _COUNTS.items()}


def reset() -> None:
    """Set every counter to zero."""
    for name in list(_COUNTS):
        _COUNTS[name] = 0
