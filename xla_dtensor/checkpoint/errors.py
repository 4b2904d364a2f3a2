"""The checkpoint error type (its own module so every part of the package can raise it).

Example:
    >>> issubclass(CheckpointError, ValueError)
    True
"""
from __future__ import annotations


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted or does not match its targets; the message names the file or key."""
