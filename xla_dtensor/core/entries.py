"""Signature entries: shape inference and the lowered function, once per (op, signature).

On a new signature the op runs once on meta tensors (torch's own shape/dtype/stride
rules and torch's own error for bad input, raised at the op) and its lowering is traced
once (``jax.eval_shape``; ``jax.make_jaxpr`` for in-place ops); the two must agree. If the lowering cannot take a scalar as a
traced parameter the op is retried, and from then on recorded, with static scalars.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import torch

from xla_dtensor import metrics
from xla_dtensor.config import config
from xla_dtensor.core.dtypes import to_jax
from xla_dtensor.core.signature import OpInfo, Slot, fill, template
from xla_dtensor.core.source import user_frame
from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.ops.registry import get_lowering

FN, VIEW, INPLACE, FALLBACK = "fn", "view", "inplace", "fallback"


class LoweringMismatchError(RuntimeError):
    """A lowering's output shape disagrees with torch's meta kernel."""


class DataDependentShapeError(NotImplementedError):
    """An op whose output shape depends on tensor values, without a host-read path on the device."""


class Entry:
    """Everything needed to record one (op, signature) on the hot path."""

    __slots__ = ("op", "key", "h", "kind", "fn", "raw", "outs", "random", "step", "n_ret", "kept", "foreach")

    def __init__(self, op: Any, key: tuple, kind: str) -> None:
        self.op, self.key, self.h, self.kind = op, key, hash(key), kind
        self.fn: Callable[..., Any] | None = None
        self.raw: Callable[..., Any] | None = None
        self.outs: list[tuple | None] = []
        self.random, self.step, self.n_ret = False, None, 0
        self.kept: frozenset[int] = frozenset()  # in-place targets the lowering returns unchanged
        self.foreach = str(op).startswith("aten._foreach_")  # item i of the outputs reads item i of the lists


def _is_random(op: Any) -> bool:
    from xla_dtensor.ops import registry
    return registry.is_random(op)


def _meta(a: Any) -> Any:
    if isinstance(a, LazyTensor):
        shape, dtype, stride = a._meta
        return torch.empty_strided(shape, stride, dtype=dtype, device="meta")
    if isinstance(a, (list, tuple)):
        return type(a)(_meta(x) for x in a)
    if isinstance(a, torch.device):
        return torch.device("meta")
    if isinstance(a, torch.Tensor) and a.device.type == "cpu":  # a 0-dim CPU tensor (signature refuses others)
        return torch.empty((), dtype=a.dtype, device="meta")
    return a


def _meta_of(t: Any) -> tuple | None:
    if t is None:
        return None
    return (tuple(t.shape), t.dtype, tuple(t.stride()))


# NOTE: meta kernels that reject inputs torch's CPU kernel accepts (``_grouped_mm``'s
# wants bf16; CPU takes float32): the lowering's own shapes and checks stand in.
_META_REJECTS_CPU_INPUTS = frozenset({torch.ops.aten._grouped_mm.default})


def run_meta(op: Any, args: tuple, kwargs: dict) -> Any:
    """``op`` on meta copies of the arguments; ``NotImplemented`` if it has no (usable) meta kernel.

    Errors torch raises for bad input (shapes, dtypes) propagate unchanged.
    """
    if op in _META_REJECTS_CPU_INPUTS:
        return NotImplemented
    margs = tuple(_meta(a) for a in args)
    mkwargs = {k: _meta(v) for k, v in kwargs.items()}
    try:
        return op(*margs, **mkwargs)
    except NotImplementedError:
        return NotImplemented
    except Exception as meta_error:
        _raise_cpu_error(op, args, kwargs, meta_error)
        if torch.Tag.dynamic_output_shape in op.tags:
            raise _data_dependent_error(op) from meta_error
        raise


def _data_dependent_error(op: Any) -> DataDependentShapeError:
    return DataDependentShapeError(
        f"{op} has an output shape that depends on tensor values, which one XLA program cannot have, and the "
        f"jax device has no host-read path for this call (at {user_frame()}). Ops read on the host instead: "
        "nonzero, argwhere, masked_select, x[mask], unique, bincount, repeat_interleave; give the size where "
        "torch allows it (output_size=, nonzero_static) or set xla_dtensor.config.cpu_fallback = True")


def _host(a: Any) -> Any:
    if isinstance(a, LazyTensor):
        shape, dtype, _ = a._meta
        return torch.zeros(shape, dtype=dtype)
    if isinstance(a, (list, tuple)):
        return type(a)(_host(x) for x in a)
    if isinstance(a, torch.device):
        return torch.device("cpu")
    return a


def _raise_cpu_error(op: Any, args: tuple, kwargs: dict, meta_error: Exception) -> None:
    """Re-raise torch CPU's own error (meta kernels word some errors differently)."""
    def numel(a: Any) -> int:
        if isinstance(a, LazyTensor):
            return a.numel()
        return sum(numel(x) for x in a) if isinstance(a, (list, tuple)) else 0
    if numel(args) + numel(list(kwargs.values())) > 1 << 22:
        return
    try:
        op(*_host(args), **{k: _host(v) for k, v in kwargs.items()})
    except type(meta_error) as cpu_error:
        raise cpu_error.with_traceback(None) from None
    except Exception:  # noqa: BLE001 - keep the meta kernel's error
        return


def _flat_outputs(op: Any, info: OpInfo, out: Any, args: tuple, kwargs: dict) -> tuple[list, int]:
    """Expected lowering outputs: non-alias returns, then the mutated arguments' new values."""
    rets = list(out) if isinstance(out, (tuple, list)) and info.n_returns != 1 or (
        info.n_returns == 1 and str(op._schema.returns[0].type) == "List[Tensor]") else [out]
    if not info.mutated:
        return [_meta_of(r) for r in rets], len(rets)
    own = [_meta_of(r) for r, alias in zip(rets, info.returns_alias) if not alias]
    muts: list[tuple | None] = []
    for pos, name in info.mutated:
        a = args[pos] if pos is not None and pos < len(args) else kwargs.get(name)
        for t in (a if isinstance(a, (list, tuple)) else [a]):
            muts.append(t._meta if isinstance(t, LazyTensor) else None)
    return own + muts, len(own)


def _lowering_for(op: Any, info: OpInfo) -> Any:
    low = get_lowering(op)
    if low is None and info.mutated and not info.out_kw:
        name, _, overload = op.name().partition("::")[2].partition(".")
        functional = getattr(torch.ops.aten, name.rstrip("_"), None)
        fop = getattr(functional, overload or "default", None) if functional is not None else None
        low = get_lowering(fop) if fop is not None else None
    return low


def build(op: Any, args: tuple, kwargs: dict, info: OpInfo, key: tuple, scalars: bool) -> Entry | None:
    """A new entry for this call, or ``None`` when scalars must be static for this op."""
    metrics._COUNTS["signature_misses"] += 1
    meta_out = run_meta(op, args, kwargs)
    if info.out_kw:
        raise NotImplementedError(f"{op}: out= variants are not supported on the jax device; use the functional form")
    targs, tkwargs, abstract = template(args, kwargs, info, scalars)
    low = _lowering_for(op, info)
    if low is None:
        if scalars and any(not hasattr(a, "shape") for a in abstract):
            return None  # the decomposition fallback bakes scalars in: retry with static scalars
        low = _decomposed(op, targs, tkwargs, abstract)
        if low is None:
            return _no_lowering(op, args, kwargs, key)
    random = _is_random(op)
    shift = 1 if random else 0

    def raw(*vals: Any) -> Any:
        a = tuple(fill(x, vals[shift:]) for x in targs)
        kw = {k: fill(v, vals[shift:]) for k, v in tkwargs.items()}
        return low(vals[0], *a, **kw) if random else low(*a, **kw)

    abstract = ([jax.ShapeDtypeStruct((2,), "uint32")] if random else []) + abstract
    try:
        if info.mutated:  # the jaxpr also says which targets come back unchanged (_unchanged)
            traced, got = jax.make_jaxpr(raw, return_shape=True)(*abstract)
        else:
            traced, got = None, jax.eval_shape(raw, *abstract)
    except (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
            jax.errors.TracerIntegerConversionError, TypeError) as e:
        if scalars and any(not hasattr(a, "shape") for a in abstract):
            return None
        raise LoweringMismatchError(f"lowering of {op} failed shape inference: {e}") from e
    got_list = list(got) if isinstance(got, (tuple, list)) else [got]
    if meta_out is NotImplemented:
        outs = [(tuple(g.shape), _torch_dtype(g.dtype), _contiguous(g.shape)) for g in got_list]
        n_ret = len(outs) if not info.mutated else 0
    else:
        outs, n_ret = _flat_outputs(op, info, meta_out, args, kwargs)
        if _shapes(outs) != _shapes(got_list):
            outs = _cpu_outputs_if_they_agree(op, info, args, kwargs, got_list) or outs
    fn = _checked(op, raw, got_list, outs)
    kind = INPLACE if info.mutated else (VIEW if info.view and len(abstract) == 1 else FN)
    e = Entry(op, key, kind)
    e.fn, e.raw, e.outs, e.random, e.n_ret = fn, raw, outs, random, n_ret
    if kind is INPLACE and len(got_list) > 1:
        e.kept = _unchanged(traced.jaxpr, n_ret, _target_slots(info, targs, tkwargs, shift))
    return e


def _target_slots(info: OpInfo, targs: tuple, tkwargs: dict, shift: int) -> list[int | None]:
    """For each in-place target, in write order, the index of its own value among the graph inputs."""
    slots: list[int | None] = []
    for pos, name in info.mutated:
        t = targs[pos] if pos is not None and pos < len(targs) else tkwargs.get(name)
        for x in (t if isinstance(t, list) else [t]):
            slots.append(x.i + shift if isinstance(x, Slot) else None)
    return slots


def _unchanged(jaxpr: Any, n_ret: int, slots: list[int | None]) -> frozenset[int]:
    """The in-place targets whose new value is their own old value, returned as is by the lowering.

    NOTE: a fused optimizer writes its gradient list back only when it unscales it
    (``grad_scale``); without, the lowering returns the gradients themselves. Writing
    such a value back would do nothing but turn a gradient that is a view (eager mode
    folds views into their reader) into a scatter into its base on every step.
    """
    ins, outs = jaxpr.invars, jaxpr.outvars[n_ret:]
    return frozenset(i for i, (v, j) in enumerate(zip(outs, slots)) if j is not None and v is ins[j])


def _torch_dtype(d: Any) -> torch.dtype:
    from xla_dtensor.core.dtypes import to_torch
    return to_torch(d)


def _contiguous(shape: tuple) -> tuple:
    stride, acc = [], 1
    for s in reversed(shape):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def _shapes(outs: list) -> list:
    return [None if m is None else tuple(m[0] if isinstance(m, tuple) else m.shape) for m in outs]


def _cpu_outputs_if_they_agree(op: Any, info: OpInfo, args: tuple, kwargs: dict, got: list) -> list | None:
    """torch CPU's output metadata when its kernel agrees with the lowering and meta does not.

    NOTE: a few meta kernels disagree with the CPU kernels (eval-mode batch norm's saved
    statistics are (C,) on meta, (0,) on CPU). CPU eager is the semantics we follow; this
    runs once per signature, and only on a mismatch.
    """
    try:
        cpu_out = op(*_host(args), **{k: _host(v) for k, v in kwargs.items()})
    except Exception:  # noqa: BLE001 - no CPU verdict: the mismatch error stands
        return None
    outs, _ = _flat_outputs(op, info, cpu_out, args, kwargs)
    return outs if _shapes(outs) == _shapes(got) else None


def _checked(op: Any, raw: Callable[..., Any], got: list, outs: list) -> Callable[..., Any]:
    if len(got) != len(outs):
        raise LoweringMismatchError(f"lowering of {op} returned {len(got)} outputs, torch gives {len(outs)}")
    casts = []
    for i, (g, m) in enumerate(zip(got, outs)):
        if m is None:
            continue
        if tuple(g.shape) != tuple(m[0]):
            raise LoweringMismatchError(f"lowering of {op} output {i} has shape {tuple(g.shape)}, torch gives {m[0]}")
        if g.dtype != to_jax(m[1]):
            casts.append((i, to_jax(m[1])))
    if not casts:
        return raw
    multi = len(outs) > 1 or isinstance(got, list) and len(got) != 1

    def fn(*vals: Any) -> Any:
        out = raw(*vals)
        if not isinstance(out, (tuple, list)):
            return out.astype(casts[0][1])
        out = list(out)
        for i, d in casts:
            out[i] = out[i].astype(d)
        return out
    del multi
    return fn


def _decomposed(op: Any, targs: tuple, tkwargs: dict, abstract: list) -> Callable[..., Any] | None:
    """torch's decomposition of ``op`` run through the lowering table, or ``None``."""
    import numpy as np

    from xla_dtensor.ops.decomp import decomposed_lowering
    fake = [np.broadcast_to(np.zeros((), a.dtype), a.shape) for a in abstract]  # shapes only, no memory
    try:
        return decomposed_lowering(op, tuple(fill(x, fake) for x in targs), {k: fill(v, fake) for k, v in tkwargs.items()})
    except NotImplementedError:
        return None


def _no_lowering(op: Any, args: tuple, kwargs: dict, key: tuple) -> Entry:
    if config.cpu_fallback:
        e = Entry(op, key, FALLBACK)
        return e
    if torch.Tag.dynamic_output_shape in op.tags:
        raise _data_dependent_error(op)
    raise missing_lowering_error(op, args, kwargs)


def missing_lowering_error(op: Any, args: tuple, kwargs: dict) -> NotImplementedError:
    """The error for an op with neither a lowering nor a decomposition."""
    def desc(a: Any) -> str:
        if isinstance(a, torch.Tensor):
            return f"{a.dtype}{list(a.shape)}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(desc(x) for x in a) + "]"
        return repr(a)
    shown = ", ".join([desc(a) for a in args] + [f"{k}={desc(v)}" for k, v in kwargs.items()])
    return NotImplementedError(
        f"aten op {op} has no lowering to JAX on the jax device (called with {shown} at {user_frame()}); "
        f"set xla_dtensor.config.cpu_fallback = True to run it on CPU")
