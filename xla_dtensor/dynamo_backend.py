"""``torch.compile(model, backend="xla_dtensor")``: FX graphs lowered through the same table.

Dynamo hands the backend a captured FX graph; AOTAutograd splits it into functional
core-ATen forward and backward graphs. Each is interpreted once, under ``jax.jit``,
with the lazy core's lowering table (torch's decomposition table for ops without a
lowering) and compiled to one executable; calls then materialize their ``jax``
tensor inputs, run the executable and wrap the results as ``jax`` tensors. Shardings
travel with the input arrays. An op with neither a lowering nor a decomposition
raises ``NotImplementedError`` naming it when the graph is compiled (never a wrong
result).

The backend is registered under the name ``xla_dtensor`` by the package's
``torch_dynamo_backends`` entry point; in a source checkout, importing this module
registers it.

Where the inputs are ``jax`` tensors (parameters included, sharded or not) the outputs
are ``jax`` tensors, laid out as XLA propagates the inputs' shardings. Where they are
CPU tensors (a CPU model), the graph still runs as one XLA program on the JAX devices
and the outputs are copied back to CPU. Dynamo fakifies a ``jax`` tensor as a fake
tensor on the ``jax`` device (``LazyTensor.__tensor_unflatten__`` under a fake mode).
torch's default backend (inductor) has no code generator for the ``jax`` device: a
graph with ``jax`` tensor inputs is compiled here instead (see :mod:`xla_dtensor.dynamo_route`).

Example:
    >>> import torch, xla_dtensor, xla_dtensor.dynamo_backend
    >>> f = torch.compile(lambda x: torch.sin(x) * 2, backend="xla_dtensor")
    >>> f(torch.zeros(2)).tolist()   # a CPU input: runs on the JAX devices, result copied back
    [0.0, 0.0]
"""
from __future__ import annotations

import operator
from typing import Any, Callable

import jax
import numpy as np
import torch
from torch.utils import _pytree as pytree

from xla_dtensor import metrics
from xla_dtensor.core import executor
from xla_dtensor.core.dtypes import to_jax
from xla_dtensor.core.ir import data_leaf
from xla_dtensor.core.tensor import LazyTensor, new_tensor
from xla_dtensor.ops.decomp import _table as _decomp_table
from xla_dtensor.ops.decomp import resolve
from xla_dtensor.ops.registry import get_lowering, is_random
from xla_dtensor.random import next_key

__all__ = ["xla_dtensor_backend", "lower_fx"]
metrics._COUNTS.setdefault("dynamo_graphs", 0)


def _check_ops(gm: torch.fx.GraphModule) -> list:
    missing, random_nodes = [], []
    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        op = n.target
        if not isinstance(op, torch._ops.OpOverload):
            raise NotImplementedError(f"xla_dtensor backend: FX node {n.name} calls {op}, not an aten op")
        if get_lowering(op) is None and op not in _decomp_table():
            missing.append(str(op))
        if is_random(op):
            random_nodes.append(n)
    if missing:
        raise NotImplementedError(
            f"xla_dtensor backend: no JAX lowering or decomposition for {', '.join(sorted(set(missing)))}")
    return random_nodes


def _meta(v: Any) -> tuple | None:
    """``(shape, dtype, stride)`` of an output's fake value; ``None`` entries where symbolic
    (a dynamic-shape graph: the array's own shape is used then)."""
    if isinstance(v, torch.Tensor):
        shape, stride = tuple(v.shape), tuple(v.stride())
        concrete = all(type(s) is int for s in (*shape, *stride))
        return (shape, v.dtype, stride) if concrete else (None, v.dtype, None)
    return None


def _interpret(gm: torch.fx.GraphModule, keys: list, *inputs: Any) -> list:
    env: dict[Any, Any] = {}
    it, kit = iter(inputs), iter(keys)

    def load(a: Any) -> Any:
        return pytree.tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else v, a)

    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = next(it)
        elif n.op == "get_attr":
            env[n] = jax.numpy.asarray(getattr(gm, n.target).detach().cpu().numpy())
        elif n.op == "call_function":
            args, kwargs = load(n.args), load(n.kwargs)
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            fn = resolve(n.target, args, kwargs)
            out = fn(next(kit), *args, **kwargs) if is_random(n.target) else fn(*args, **kwargs)
            env[n] = _cast(out, n.meta.get("val"))
        elif n.op == "output":
            return list(load(n.args[0]))
    raise ValueError("FX graph has no output node")


def _cast(out: Any, val: Any) -> Any:
    if isinstance(val, torch.Tensor) and hasattr(out, "dtype") and out.dtype != to_jax(val.dtype):
        return out.astype(to_jax(val.dtype))
    if isinstance(val, (list, tuple)) and isinstance(out, (list, tuple)):
        return type(out)(_cast(o, v) for o, v in zip(out, val))
    return out


def _to_array(x: Any) -> Any:
    if isinstance(x, LazyTensor):
        return executor.materialize(x)
    if isinstance(x, torch.Tensor):
        metrics._COUNTS["transfers_to_device"] += 1
        return jax.device_put(np.array(x.detach().cpu().numpy(), copy=True))
    return x


def lower_fx(gm: torch.fx.GraphModule, example_inputs: list) -> Callable[..., list]:
    """Compile an FX graph of aten ops into a callable over ``jax`` tensors.

    Example:
        >>> import torch
        >>> from torch.fx.experimental.proxy_tensor import make_fx
        >>> gm = make_fx(lambda x: [torch.ops.aten.mul.Tensor(x, x)])(torch.ones(2))
        >>> lower_fx(gm, [])(torch.full((2,), 3.0, device="jax"))[0].tolist()
        [9.0, 9.0]
    """
    random_nodes = _check_ops(gm)
    metrics._COUNTS["dynamo_graphs"] += 1
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_metas = [_meta(a.meta.get("val")) if isinstance(a, torch.fx.Node) else None for a in out_node.args[0]]
    sizes = [isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), (int, torch.SymInt))
             for a in out_node.args[0]]  # a dynamic-shape graph also returns sizes: Python ints
    n_keys = len(random_nodes)
    jitted = jax.jit(lambda keys, *xs: _interpret(gm, keys, *xs))
    compiled: dict[tuple, Any] = {}

    def run(*args: Any) -> list:
        arrays = [_to_array(a) for a in args]
        keys = [next_key() for _ in range(n_keys)]
        sig = tuple((getattr(a, "shape", None), str(getattr(a, "dtype", type(a))), getattr(a, "sharding", None))
                    for a in arrays)
        exe = compiled.get(sig)
        if exe is None:
            exe = compiled[sig] = jitted.lower(keys, *arrays).compile()
            metrics._COUNTS["compiles"] += 1
        outs = exe(keys, *arrays)
        metrics._COUNTS["executions"] += 1
        if not any(isinstance(a, LazyTensor) for a in args):  # CPU inputs: CPU results (see module doc)
            return [_to_cpu(o, m) for o, m in zip(outs, out_metas)]
        res = []
        for o, m, size in zip(outs, out_metas, sizes):
            if size:
                res.append(int(np.asarray(o)))
                continue
            if m is None or o is None:
                res.append(o if m is None and not hasattr(o, "shape") else
                           (None if o is None else _wrap(o, (tuple(o.shape), _dtype(o), None))))
            else:
                res.append(_wrap(o, m))
        return res
    return run


def _to_cpu(arr: Any, meta: tuple | None) -> Any:
    if not hasattr(arr, "shape"):
        return arr
    metrics._COUNTS["transfers_to_host"] += 1
    dtype = _dtype(arr)
    host = np.array(arr, dtype=np.float32 if dtype == torch.bfloat16 else None)
    t = torch.from_numpy(host).to(dtype)
    if meta is not None and meta[2] is not None and len(meta[2]) == t.dim() and t.dim() > 1:
        t = torch.empty_strided(meta[0], meta[2], dtype=dtype).copy_(t)
    return t


def _dtype(arr: Any) -> torch.dtype:
    from xla_dtensor.core.dtypes import to_torch
    return to_torch(arr.dtype)


def _wrap(arr: Any, meta: tuple) -> LazyTensor:
    shape, dtype, stride = meta
    shape = tuple(arr.shape) if shape is None else shape
    if stride is None or len(stride) != len(shape):
        acc, st = 1, []
        for s in reversed(shape):
            st.append(acc)
            acc *= max(s, 1)
        stride = tuple(reversed(st))
    return new_tensor((shape, dtype, stride), data_leaf(arr, shape, dtype))


def xla_dtensor_backend(gm: torch.fx.GraphModule, example_inputs: list, **kwargs: Any) -> Callable[..., Any]:
    """The dynamo backend: AOTAutograd (forward + backward graphs), each lowered by :func:`lower_fx`."""
    from functorch.compile import make_boxed_func
    from torch._decomp import core_aten_decompositions
    from torch._dynamo.backends.common import aot_autograd
    decomps = {op: fn for op, fn in core_aten_decompositions().items() if get_lowering(op) is None}
    boxed = lambda gm_, inputs: make_boxed_func(lower_fx(gm_, inputs))  # noqa: E731
    return aot_autograd(fw_compiler=boxed, bw_compiler=boxed, decompositions=decomps)(
        gm, fake_inputs(example_inputs), **kwargs)


class _Tangent(LazyTensor):
    """A ``jax`` tensor that torch does not take for a traceable wrapper subclass.

    NOTE: AOTAutograd traced our tensors as plain (fake) tensors, so at run time it
    accepts a gradient only if ``is_traceable_wrapper_subclass`` is false for it; the
    two properties below make ``hasattr(t, "__tensor_flatten__")`` false. It shares the
    tensor's storage and is only ever read by the compiled backward.
    """

    @property
    def __tensor_flatten__(self) -> Any:  # type: ignore[override]
        raise AttributeError("__tensor_flatten__")

    @property
    def __tensor_unflatten__(self) -> Any:  # type: ignore[override]
        raise AttributeError("__tensor_unflatten__")


def plain_tangent(t: LazyTensor, expected_type: Any) -> Any:
    """``t`` as a gradient AOTAutograd accepts where it expects a plain tensor, else ``None``."""
    if expected_type not in (None, torch.Tensor):
        return None
    from xla_dtensor.core.tensor import wrap_like
    t = t.contiguous()  # NOTE: AOTAutograd would make it contiguous itself, giving back a traceable one
    return wrap_like(_Tangent, t)


def fake_inputs(example_inputs: list) -> list:
    """Dynamo's example inputs with each ``jax`` tensor replaced by its fake tensor.

    NOTE: dynamo hands backends the real inputs and AOTAutograd fakifies them again, but
    it takes a wrapper subclass with no inner tensors (ours) for an already-fake one.
    The fake comes from the same fake mode and symbolic context dynamo used.
    """
    from torch._guards import TracingContext, detect_fake_mode
    if not any(isinstance(x, LazyTensor) for x in example_inputs):
        return example_inputs
    fake_mode, ctx = detect_fake_mode(), TracingContext.try_get()
    if fake_mode is None:
        return example_inputs
    out = []
    for x in example_inputs:
        if isinstance(x, LazyTensor):
            sym = ctx.tensor_to_context.get(x) if ctx is not None else None
            x = fake_mode.from_tensor(x, symbolic_context=sym, source=getattr(sym, "tensor_source", None),
                                      trace=False)
        out.append(x)
    return out


def _register() -> None:
    from torch._dynamo.backends.registry import _BACKENDS, register_backend
    if "xla_dtensor" not in _BACKENDS:
        register_backend(xla_dtensor_backend, name="xla_dtensor")


_register()
