"""Make ``import torchvision`` (and so ``import timm``) work where its C++ ops do not load.

torchvision 0.28's only wheel on the registry is a CUDA build; on CPU torch its ``_C.so``
fails to load, and ``torchvision/_meta_registrations.py`` then dies at import with
``RuntimeError: operator torchvision::nms does not exist`` (it registers fake kernels for
``nms``/``qnms`` without checking that the library loaded). This shim defines the
``torchvision::`` operator *schemas* with ``torch.library`` before torchvision is imported,
so those registrations find their operators. No kernel is provided: torchvision's detection
ops (``torchvision.ops.nms``, ``roi_align``) still raise torchvision's own "Couldn't load
custom C++ ops" ``RuntimeError``, and ``torch.ops.torchvision.<op>`` called directly raises
``NotImplementedError`` naming the op. Models built from convolutions, pooling and linear
layers (timm ``resnet18``, ``vit_tiny_patch16_224``) never call them.

If torchvision's own library loads, the shim does nothing.

Example:
    >>> from tests.integration._torchvision_shim import install
    >>> install()
    >>> import timm  # imports torchvision
"""
from __future__ import annotations

import importlib.util
import os

import torch

# The schemas torchvision 0.28's ``_C.so`` defines (read from the library's strings).
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "box_iou_rotated(Tensor boxes1, Tensor boxes2) -> Tensor",
    "roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio, bool aligned) -> Tensor",
    "_roi_align_backward(Tensor grad, Tensor rois, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "qroi_align(Tensor input, Tensor rois, float input_scale, int input_zero_point, float rois_scale, "
    "int rois_zero_point, float spatial_scale, SymInt pooled_height, SymInt pooled_width, int sampling_ratio, "
    "bool aligned) -> Tensor",
    "ps_roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
    "int sampling_ratio) -> (Tensor, Tensor)",
    "_ps_roi_align_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, int sampling_ratio, SymInt batch_size, SymInt channels, "
    "SymInt height, SymInt width) -> Tensor",
    "roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_roi_pool_backward(Tensor grad, Tensor rois, Tensor argmax, float spatial_scale, SymInt pooled_height, "
    "SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, SymInt width) -> Tensor",
    "ps_roi_pool(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width) "
    "-> (Tensor, Tensor)",
    "_ps_roi_pool_backward(Tensor grad, Tensor rois, Tensor channel_mapping, float spatial_scale, "
    "SymInt pooled_height, SymInt pooled_width, SymInt batch_size, SymInt channels, SymInt height, "
    "SymInt width) -> Tensor",
    "deform_conv2d(Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, SymInt stride_h, "
    "SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, SymInt groups, "
    "SymInt offset_groups, bool use_mask) -> Tensor",
    "_deform_conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor offset, Tensor mask, Tensor bias, "
    "SymInt stride_h, SymInt stride_w, SymInt pad_h, SymInt pad_w, SymInt dilation_h, SymInt dilation_w, "
    "SymInt groups, SymInt offset_groups, bool use_mask) -> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    "_cuda_version() -> int",
)
_LIB: torch.library.Library | None = None  # kept alive: a dropped DEF library removes its operators


def _native_ops_load() -> bool:
    """Whether torchvision's own ``_C.so`` loads (then its ops are real and no shim is wanted)."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return False
    path = os.path.join(list(spec.submodule_search_locations)[0], "_C.so")
    try:
        torch.ops.load_library(path)
    except (OSError, RuntimeError):
        return False
    return True


def _defined(name: str) -> bool:
    try:
        torch._C._dispatch_find_schema_or_throw(f"torchvision::{name}", "")
    except RuntimeError:
        return False
    return True


def _unavailable(name: str):
    def kernel(*args: object, **kwargs: object) -> object:
        raise NotImplementedError(
            f"torchvision::{name} has no kernel: torchvision's C++ ops did not load on this torch build "
            "(tests/integration/_torchvision_shim.py defined only its schema)")
    return kernel


def install() -> bool:
    """Define the missing ``torchvision::`` schemas; returns whether the shim was needed.

    Idempotent; call it before the first ``import torchvision`` / ``import timm``.
    """
    global _LIB
    if _LIB is not None or _defined("nms") or _native_ops_load():
        return _LIB is not None
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS:
        name = schema.split("(", 1)[0]
        lib.define(schema)
        lib.impl(name, _unavailable(name), "CPU")
    _LIB = lib
    return True
