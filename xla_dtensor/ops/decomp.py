"""Fallback for aten ops without a lowering: torch's decomposition table, interpreted with our lowerings.

``decomposed_lowering(op, args, kwargs)`` traces ``op`` with ``make_fx`` on meta
tensors of the arguments' shapes and dtypes, using torch's core-ATen decompositions,
and returns a JAX-traceable function that runs the resulting FX graph node by node
through the lowering table (recursing into this fallback for nodes without a
lowering). Graphs are cached per (op, argument signature). Tensors are the
non-weak JAX arrays among the arguments; everything else (including scalars) is
baked into the graph as a constant, so scalars must be concrete here.

Example:
    >>> import torch, jax.numpy as jnp
    >>> fn = decomposed_lowering(torch.ops.aten.hardshrink.default, (jnp.asarray([-1.0, 0.2]), 0.5), {})
    >>> fn(jnp.asarray([-1.0, 0.2]), 0.5).tolist()
    [-1.0, 0.0]
"""
from __future__ import annotations

import operator
from functools import lru_cache
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils import _pytree as pytree

from xla_dtensor.ops.dtypes import to_jax, to_torch
from xla_dtensor.ops.registry import get_lowering, is_random

aten = torch.ops.aten


def _is_tensor(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray)) and not (getattr(x, "weak_type", False) and x.ndim == 0)


def _describe(x: Any) -> str:
    if hasattr(x, "shape") and hasattr(x, "dtype"):
        dt = x.dtype
        try:
            dt = str(to_torch(dt)).replace("torch.", "")
        except TypeError:
            pass
        return f"{dt}{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_describe(v) for v in x) + "]"
    return repr(x)


def missing_lowering_error(op: Any, args: tuple = (), kwargs: dict | None = None) -> NotImplementedError:
    """The error to raise for an aten op with neither a lowering nor a decomposition.

    Example:
        >>> str(missing_lowering_error("aten::foo", (jnp.zeros((2, 3)),)))[:40]
        'no JAX lowering for aten::foo with argum'
    """
    parts = [_describe(a) for a in args] + [f"{k}={_describe(v)}" for k, v in (kwargs or {}).items()]
    return NotImplementedError(
        f"no JAX lowering for {op} with arguments ({', '.join(parts)}), and torch's decomposition table "
        "has no entry that lowers it; add one in xla_dtensor/ops/")


@lru_cache(maxsize=1)
def _table() -> dict[Any, Callable[..., Any]]:
    from torch._decomp import core_aten_decompositions
    return dict(core_aten_decompositions())


def _scalarize(x: Any) -> Any:
    if getattr(x, "weak_type", False) and getattr(x, "ndim", 1) == 0:
        if isinstance(x, jax.core.Tracer):
            raise NotImplementedError("decomposition fallback needs concrete scalars, got a traced weak scalar")
        return x.item()
    return x


def _signature(flat: list[Any]) -> tuple:
    sig = []
    for x in flat:
        if _is_tensor(x):
            sig.append(("T", tuple(x.shape), str(x.dtype)))
        else:
            sig.append(("C", repr(x) if isinstance(x, float) else x))
    return tuple(sig)


_GRAPHS: dict[tuple, Any] = {}


def _trace(op: Any, flat: list[Any], spec: Any) -> Any:
    metas = [torch.empty(x.shape, dtype=to_torch(x.dtype), device="meta") if _is_tensor(x) else x for x in flat]
    slots = [i for i, x in enumerate(flat) if _is_tensor(x)]

    def call(*tensors: torch.Tensor) -> Any:
        vals = list(metas)
        for i, t in zip(slots, tensors):
            vals[i] = t
        a, k = pytree.tree_unflatten(vals, spec)
        return op(*a, **k)

    from torch.fx.experimental.proxy_tensor import make_fx
    return make_fx(call, decomposition_table=_table())(*[metas[i] for i in slots])


def _run_node(target: Any, args: tuple, kwargs: dict, key: Any, counter: list[int]) -> Any:
    if target is operator.getitem:
        return args[0][args[1]]
    fn = get_lowering(target)
    if fn is None:
        fn = decomposed_lowering(target, args, kwargs)
    if is_random(target):
        if key is None:
            raise NotImplementedError(f"decomposition of a random op needs a key: {target}")
        counter[0] += 1
        return fn(jax.random.fold_in(key, counter[0]), *args, **kwargs)
    return fn(*args, **kwargs)


def _interpret(gm: Any, tensors: list[Any], key: Any) -> Any:
    env: dict[Any, Any] = {}
    it = iter(tensors)
    counter = [0]

    def load(a: Any) -> Any:
        return pytree.tree_map(lambda v: env[v] if isinstance(v, torch.fx.Node) else
                               (jnp.asarray(v.numpy()) if isinstance(v, torch.Tensor) else v), a)

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(it)
        elif node.op == "get_attr":
            env[node] = jnp.asarray(getattr(gm, node.target).detach().cpu().numpy())
        elif node.op == "call_function":
            env[node] = _run_node(node.target, load(node.args), load(node.kwargs), key, counter)
        elif node.op == "output":
            out = load(node.args[0])
            return out
    raise ValueError("FX graph has no output node")


def decomposed_lowering(op: Any, args: tuple, kwargs: dict | None = None) -> Callable[..., Any]:
    """A JAX function computing ``op`` via torch's decomposition, for arguments like ``args``.

    Raises ``missing_lowering_error`` when torch has no decomposition for ``op``. The
    returned function takes the same ``(*args, **kwargs)``; if the decomposition
    contains random ops, pass ``key=`` as well.
    """
    kwargs = kwargs or {}
    if op not in _table():
        raise missing_lowering_error(op, args, kwargs)
    flat, spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
    flat = [_scalarize(x) for x in flat]
    sig = (op, _signature(flat), str(spec))
    gm = _GRAPHS.get(sig)
    if gm is None:
        try:
            gm = _trace(op, flat, spec)
        except Exception as e:  # noqa: BLE001 - tracing failures become a clear lowering error
            raise missing_lowering_error(op, args, kwargs) from e
        _GRAPHS[sig] = gm

    def run(*call_args: Any, key: Any = None, **call_kwargs: Any) -> Any:
        leaves = pytree.tree_leaves((tuple(call_args), dict(call_kwargs)))
        out = _interpret(gm, [x for x in leaves if _is_tensor(x)], key)
        return tuple(out) if isinstance(out, list) and op._schema.returns and len(op._schema.returns) > 1 else out

    return run


def resolve(op: Any, args: tuple, kwargs: dict | None = None) -> Callable[..., Any]:
    """The lowering of ``op`` if registered, else its decomposition; else raises NotImplementedError."""
    fn = get_lowering(op)
    return fn if fn is not None else decomposed_lowering(op, args, kwargs)


del to_jax
