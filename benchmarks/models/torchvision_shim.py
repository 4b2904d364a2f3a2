"""Let torchvision (and so timm and transformers' image utilities) import on CPU torch.

The only torchvision wheel on PyPI for torch 2.13 is a CUDA build: its C++ ops library
does not load on the CPU torch wheel, and ``import torchvision`` then fails while
registering fake kernels for ``torchvision::nms`` / ``torchvision::qnms``, ops that
were never defined. :func:`install` defines just those two schemas (no kernels) when
they are missing, so the import succeeds; calling them raises torch's "no kernel"
error. The models here never call them (no detection ops). Nothing happens when the
ops exist (a working torchvision) or torchvision is not installed.

Example:
    >>> install() in (True, False)
    True
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

__all__ = ["install"]

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIB: list[torch.library.Library] = []


def _defined(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name).default
    except (AttributeError, RuntimeError):
        return False
    return True


def _load_ops(origin: str | None) -> bool:
    """Load torchvision's C++ ops library if it loads here (a torchvision built for this torch)."""
    for path in Path(origin or ".").parent.glob("_C*.so"):
        try:
            torch.ops.load_library(str(path))
        except (OSError, RuntimeError):
            return False
        return True
    return False


def install() -> bool:
    """Define the missing ``torchvision::`` schemas; ``True`` if any was missing."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None:
        return False
    missing = [n for n in _SCHEMAS if not _defined(n)]
    if missing and _load_ops(spec.origin):  # a working torchvision (say CUDA torch with its CUDA build)
        missing = [n for n in _SCHEMAS if not _defined(n)]
    if not missing:
        return False
    lib = torch.library.Library("torchvision", "FRAGMENT")  # noqa: TOR901  (schemas only)
    for name in missing:
        lib.define(_SCHEMAS[name])
    _LIB.append(lib)  # NOTE: the definitions live as long as the Library object
    return True
