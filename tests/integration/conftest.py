"""Integration tests with third-party models (see benchmarks/models/zoo.py)."""
from __future__ import annotations

from benchmarks.models.torchvision_shim import install

install()  # timm and transformers' Mixtral import torchvision, whose C++ ops do not load on CPU torch
