"""The user's source line behind an op: the innermost frame outside torch and xla_dtensor.

Example:
    >>> where = user_frame()
    >>> ":" in where
    True
"""
from __future__ import annotations

import os
import sys

import torch

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # xla_dtensor/
_SKIP = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep, _PACKAGE + os.sep)


def user_frame(depth: int = 1) -> str:
    """``"file:line in function"`` of the innermost caller outside torch and xla_dtensor."""
    f = sys._getframe(depth)
    while f is not None:
        path = f.f_code.co_filename
        if not path.startswith(_SKIP) and not path.startswith("<frozen"):
            return f"{path}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "<unknown>"
