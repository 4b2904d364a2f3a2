"""torch_xla raises ``AssertionError`` where this project raises its own (``ValueError``) types.

:func:`assertion` re-raises a project error as a class deriving from both, so ``except
AssertionError`` (torch_xla code) and ``except MeshShapeError`` (this project) both catch it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator


@functools.cache
def _with_assertion(cls: type[Exception]) -> type[Exception]:
    return type(cls.__name__, (cls, AssertionError), {"__module__": cls.__module__, "__doc__": cls.__doc__})


@contextlib.contextmanager
def assertion(*kinds: type[Exception]) -> Iterator[None]:
    """Re-raise an error of one of ``kinds`` as the same error that is also an ``AssertionError``."""
    try:
        yield
    except kinds as err:
        if isinstance(err, AssertionError):
            raise
        raise _with_assertion(type(err))(*err.args) from None
