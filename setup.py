"""The one compiled part of the package: the lazy recorder's hot path (``xla_dtensor/core/_native.c``).

Everything else about the package is in ``pyproject.toml``. The extension is optional: without a
C compiler the install still succeeds and the recorder runs in Python (``xla_dtensor.core.native``
says so, with the reason, at import).
"""
from setuptools import Extension, setup

setup(ext_modules=[Extension("xla_dtensor.core._native", ["xla_dtensor/core/_native.c"], optional=True)])
