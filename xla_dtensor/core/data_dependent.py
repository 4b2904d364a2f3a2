"""Ops whose result shape depends on tensor values: computed with one host read.

``nonzero`` (and ``torch.where(cond)``, ``argwhere``), ``masked_select`` and indexing
with a boolean mask (``x[mask]``) need the mask's values to know their output
shape (``unique`` runs on the host copy of its input; ``bincount`` reads its input's
range and ``repeat_interleave(repeats)`` their total, then go on with a static length). Like torch_xla, the device reads the mask back (``sync`` of what it needs,
counted in ``transfers_to_host``), finds the indices on the host, and continues
lazily with integer indices. Inside ``xla_dtensor.compile`` such a read makes the
function run lazily (a ``DataDependentWarning``). Assigning through a boolean mask
with one value (``x[mask] = 0``) needs no read: it is ``torch.where``.

Example:
    >>> import torch, xla_dtensor
    >>> x = torch.tensor([1.0, -2.0, 3.0], device=xla_dtensor.device())
    >>> x[x > 0].tolist()
    [1.0, 3.0]
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.core.dispatch import SPECIAL, record
from xla_dtensor.core.executor import to_cpu
from xla_dtensor.core.tensor import LazyTensor

aten = torch.ops.aten
_MASK_DTYPES = (torch.bool, torch.uint8)


def _is_mask(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype in _MASK_DTYPES


def _as_bool(t: torch.Tensor) -> torch.Tensor:
    # NOTE: aten ops only: inside __torch_dispatch__ composite ops (``Tensor.to``) are not decomposed
    return t if t.dtype == torch.bool else aten._to_copy.default(t, dtype=torch.bool)


def _host_nonzero(mask: torch.Tensor) -> torch.Tensor:
    """``mask.nonzero()`` computed on the host from the mask's values (one read)."""
    host = to_cpu(mask) if isinstance(mask, LazyTensor) else mask.detach().cpu()
    return host.nonzero()


def _nonzero(op: Any, args: tuple, kwargs: dict) -> Any:
    idx = _host_nonzero(args[0])
    return idx.to(args[0].device)


def _integer_indices(self: torch.Tensor, indices: list) -> list:
    """``indices`` with each boolean mask replaced by the integer index tensors it selects."""
    out: list = []
    dim = 0
    for idx in indices:
        if _is_mask(idx):
            k = idx.dim()
            if k == 0:
                raise NotImplementedError("indexing with a 0-dim boolean mask (x[True]) is not supported on the jax "
                                          "device; use x.unsqueeze(0) or a 1-dim mask")
            want = tuple(self.shape[dim:dim + k])
            if tuple(idx.shape) != want:
                raise IndexError(f"The shape of the mask {list(idx.shape)} at index {dim} does not match the "
                                 f"shape of the indexed tensor {list(self.shape)}")
            cols = _host_nonzero(_as_bool(idx)).to(self.device)
            out.extend(cols.unbind(1))
            dim += k
        else:
            out.append(idx)
            dim += 1
    return out


def _index(op: Any, args: tuple, kwargs: dict) -> Any:
    self, indices = args[0], list(args[1])
    if not any(_is_mask(i) for i in indices):
        return record(op, args, kwargs)
    return record(op, (self, _integer_indices(self, indices)), {})


def _index_put(op: Any, args: tuple, kwargs: dict) -> Any:
    self, indices, values = args[0], list(args[1]), args[2]
    accumulate = (args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if not any(_is_mask(i) for i in indices):
        return record(op, args, kwargs)
    mask = indices[0]
    if len(indices) == 1 and _is_mask(mask) and values.numel() == 1 and not accumulate \
            and tuple(mask.shape) == tuple(self.shape[:mask.dim()]) and isinstance(values, LazyTensor):
        # NOTE: one value through one leading mask is an elementwise select: no host read
        m = aten.view.default(_as_bool(mask), tuple(mask.shape) + (1,) * (self.dim() - mask.dim()))
        v = aten._to_copy.default(aten.view.default(values, ()), dtype=self.dtype)
        new = aten.where.self(m, v, self)
        if op is aten.index_put_.default:
            return aten.copy_.default(self, new)
        return new
    return record(op, (self, _integer_indices(self, indices), values, accumulate), {})


def _masked_select(op: Any, args: tuple, kwargs: dict) -> Any:
    self, mask = args[0], args[1]
    shape = torch.broadcast_shapes(tuple(self.shape), tuple(mask.shape))
    x = aten.expand.default(self, shape)
    m = aten.expand.default(_as_bool(mask), shape)
    return _index(aten.index.Tensor, (x, [m]), {})


def _on_host(op: Any, args: tuple, kwargs: dict) -> Any:
    """``op`` run by torch on the host copy of its input; results back on the device (``unique``)."""
    x = args[0]
    res = op(to_cpu(x), *args[1:], **kwargs)
    return tuple(r.to(x.device) for r in res) if isinstance(res, (tuple, list)) else res.to(x.device)


def _bincount(op: Any, args: tuple, kwargs: dict) -> Any:
    """``bincount``: the input's range read on the host (one read), then a static-length count."""
    x = args[0]
    weights = args[1] if len(args) > 1 else kwargs.get("weights")
    minlength = args[2] if len(args) > 2 else kwargs.get("minlength", 0)
    if not isinstance(x, LazyTensor) or x.dim() != 1 or x.dtype.is_floating_point or x.dtype.is_complex \
            or x.dtype == torch.bool:
        raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (got {x.dtype} of shape "
                           f"{list(x.shape)})")
    if weights is not None and tuple(weights.shape) != tuple(x.shape):
        raise RuntimeError(f"weights should be 1-d and have the same length as input (input {list(x.shape)}, "
                           f"weights {list(weights.shape)})")
    if minlength < 0:
        raise RuntimeError(f"minlength should be >= 0, got {minlength}")
    length = minlength
    if x.numel():
        lo, hi = to_cpu(aten.stack.default([aten.min.default(x), aten.max.default(x)])).tolist()
        if lo < 0:
            raise RuntimeError(f"bincount only supports 1-d non-negative integral inputs (found {lo})")
        length = max(minlength, hi + 1)
    return record(op, (x, weights, length), {})


def _repeat_interleave(op: Any, args: tuple, kwargs: dict) -> Any:
    """``repeat_interleave(repeats)``: the total read on the host (one read) unless ``output_size`` is given."""
    repeats = args[0]
    if kwargs.get("output_size") is not None or not isinstance(repeats, LazyTensor):
        return record(op, args, kwargs)
    if repeats.dim() > 1:
        raise RuntimeError(f"repeat_interleave only accept 1D vector as repeat (got shape {list(repeats.shape)})")
    size = int(to_cpu(aten.sum.default(repeats)).item()) if repeats.numel() else 0
    return record(op, (repeats,), {"output_size": size})


SPECIAL.update({
    aten.bincount.default: _bincount,
    aten.repeat_interleave.Tensor: _repeat_interleave,
    aten._unique.default: _on_host,
    aten._unique2.default: _on_host,
    aten.unique_dim.default: _on_host,
    aten.unique_consecutive.default: _on_host,
    aten.nonzero.default: _nonzero,
    aten.index.Tensor: _index,
    aten.index_put_.default: _index_put,
    aten.index_put.default: _index_put,
    aten.masked_select.default: _masked_select,
})
