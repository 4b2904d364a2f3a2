"""argparse pieces shared by the command lines (``python -m autoshard``, ``xla_dtensor.visualize``).

Every bad argument ends the same way: one line on stderr naming the bad value and
what is allowed, exit code 2, no traceback.

Example:
    >>> p = OneLineParser(prog="demo")
    >>> _ = p.add_argument("--n", type=positive_int, default=1, help="a count (default: %(default)s)")
    >>> p.parse_args(["--n", "3"]).n
    3
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import NoReturn

__all__ = ["OneLineParser", "fail", "int_list", "mesh_shape", "output_file", "positive_float",
           "positive_int", "nonnegative_int", "readable_file"]


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line: ``prog: error: message (see --help)``."""

    def error(self, message: str) -> NoReturn:
        fail(self.prog, message)


def fail(prog: str, message: str, *, usage_hint: bool = True) -> NoReturn:
    """Print ``prog: error: message`` (one line) and exit with code 2."""
    one_line = " ".join(str(message).split())
    hint = f" (see {prog} --help)" if usage_hint else ""
    sys.stderr.write(f"{prog}: error: {one_line}{hint}\n")
    raise SystemExit(2)


def _number(text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        noun = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None


def positive_int(text: str) -> int:
    """An integer >= 1."""
    n = _number(text, int)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return int(n)


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    n = _number(text, int)
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return int(n)


def positive_float(text: str) -> float:
    """A finite number > 0 (rejects 0, negatives, nan and inf)."""
    x = float(_number(text, float))
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return x


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1, e.g. ``16,32``."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 16,32, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"expected integers >= 1 like 16,32, got {text!r}")
    return values


def mesh_shape(text: str) -> tuple[int, ...]:
    """A mesh shape such as ``8``, ``2x4`` or ``2x2x2`` (sizes >= 1)."""
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a shape like 8 or 2x4, got {text!r}") from None
    if any(n < 1 for n in shape):
        raise argparse.ArgumentTypeError(f"mesh sizes must be >= 1, got {text!r}")
    return shape


def readable_file(text: str) -> Path:
    """An existing, readable regular file."""
    path = Path(text)
    if not path.is_file():
        what = "is a directory" if path.is_dir() else "does not exist"
        raise argparse.ArgumentTypeError(f"{text!r} {what}; expected a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text!r} is not readable")
    return path


def output_file(text: str) -> Path:
    """A file path whose folder exists and is writable (the file itself may not exist yet)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file path")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text!r} {what}")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return path
