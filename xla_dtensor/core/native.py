"""Whether the recorder's hot path runs in C, and why not when it does not.

``xla_dtensor/core/_native.c`` (built at install: ``pip install -e .``, ``python3 dev.py setup``)
holds the IR node type, hash-consing, the tape and call signatures, the work every recorded
op does (:mod:`.ir`, :mod:`.signature` keep the same code in Python as the reference). The
choice is made once, at import: ``XLA_DTENSOR_NATIVE=0`` takes the Python path; a missing
build takes it too, with a warning that says how to build.

Example:
    >>> from xla_dtensor.core import native
    >>> native.ON or bool(native.REASON)
    True
"""
from __future__ import annotations

import os
import warnings
from types import ModuleType

MODULE: ModuleType | None = None
REASON = ""  # why the Python path records ("" when C does)

if os.environ.get("XLA_DTENSOR_NATIVE", "1") == "0":
    REASON = "XLA_DTENSOR_NATIVE=0"
else:
    try:
        from xla_dtensor.core import _native as MODULE  # type: ignore[no-redef]
    except ImportError as error:
        REASON = f"xla_dtensor.core._native is not built ({error})"
        warnings.warn(f"{REASON}: lazy mode records in Python, about 2x the host time per op. Build it with "
                      "`pip install -e .` (a C compiler and Python's headers), or set XLA_DTENSOR_NATIVE=0 "
                      "to choose the Python recorder without this warning.", RuntimeWarning, stacklevel=2)

ON = MODULE is not None
