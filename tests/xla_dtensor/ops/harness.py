"""Compare a lowering with torch CPU eager on the same inputs (the oracle)."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch
from torch.utils import _pytree as pytree

from xla_dtensor.ops import get_lowering, is_random
from xla_dtensor.ops.dtypes import to_jax, to_torch

_GEN = torch.Generator().manual_seed(0)
TOL = {torch.float32: (1.3e-5, 1e-5), torch.float64: (1e-9, 1e-9), torch.bfloat16: (1.6e-2, 1e-2),
       torch.float16: (1e-3, 1e-3), torch.complex64: (1.3e-5, 1e-5)}


def T(*shape: int, dtype: torch.dtype = torch.float32, low: float = -2, high: float = 2) -> torch.Tensor:
    """A seeded random torch tensor: uniform floats in [low, high), ints in [low, high), bools."""
    if dtype == torch.bool:
        return torch.rand(shape, generator=_GEN) > 0.5
    if dtype.is_floating_point:
        return (torch.rand(shape, generator=_GEN, dtype=torch.float64) * (high - low) + low).to(dtype)
    return torch.randint(int(low), int(high), shape, generator=_GEN).to(dtype)


def to_jnp(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous()
        if x.dtype in (torch.bfloat16, torch.float16):
            return jnp.asarray(x.float().numpy()).astype(to_jax(x.dtype))
        return jnp.asarray(x.numpy().copy())  # no aliasing: torch may mutate x in place later
    return x


def noncontig(x: Any) -> Any:
    """Same values, transposed strides (torch side of the stride-independence check)."""
    if isinstance(x, torch.Tensor) and x.ndim >= 2:
        return x.transpose(-1, -2).contiguous().transpose(-1, -2)
    return x


def assert_match(ours: Any, ref: Any, where: str = "", tol: tuple[float, float] | None = None) -> None:
    if isinstance(ref, (list, tuple)):
        assert isinstance(ours, (list, tuple)) and len(ours) == len(ref), f"{where}: {type(ours)} vs {len(ref)} outputs"
        for i, (o, r) in enumerate(zip(ours, ref)):
            assert_match(o, r, f"{where}[{i}]", tol)
        return
    if ref is None:
        assert ours is None, f"{where}: expected None"
        return
    if not isinstance(ref, torch.Tensor):
        assert ours == ref, f"{where}: {ours} != {ref}"
        return
    ref = ref.resolve_conj().resolve_neg()  # torch's lazy conjugate/negative bits: compare values
    assert tuple(ours.shape) == tuple(ref.shape), f"{where}: shape {tuple(ours.shape)} != torch {tuple(ref.shape)}"
    assert to_torch(ours.dtype) == ref.dtype, f"{where}: dtype {ours.dtype} != torch {ref.dtype}"
    got = np.asarray(jnp.asarray(ours).astype(jnp.float64) if ref.dtype in (torch.bfloat16, torch.float16)
                     else ours)
    want = ref.detach().double().numpy() if ref.dtype in (torch.bfloat16, torch.float16) else ref.detach().numpy()
    if ref.dtype.is_floating_point or ref.dtype.is_complex:
        rtol, atol = tol or TOL.get(ref.dtype, (1e-5, 1e-5))
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)
    else:
        np.testing.assert_array_equal(got, want, err_msg=where)


def check(op: Any, *args: Any, tol: tuple[float, float] | None = None, jit: bool = False,
          strides: bool = True, **kwargs: Any) -> None:
    """Run ``op`` in torch and through its lowering; assert equal shapes, dtypes and values."""
    fn = get_lowering(op)
    assert fn is not None, f"no lowering for {op}"
    assert not is_random(op)
    ref = op(*args, **kwargs)
    jargs, jkwargs = pytree.tree_map(to_jnp, (args, kwargs))
    if jit:
        tensors = [a for a in pytree.tree_leaves(jargs) if isinstance(a, jax.Array)]
        leaves, spec = pytree.tree_flatten((jargs, jkwargs))
        slots = [i for i, a in enumerate(leaves) if isinstance(a, jax.Array)]

        def run(*ts: Any) -> Any:
            vals = list(leaves)
            for i, t in zip(slots, ts):
                vals[i] = t
            a, k = pytree.tree_unflatten(vals, spec)
            return fn(*a, **k)
        ours = jax.jit(run)(*tensors)
        shapes = jax.eval_shape(run, *tensors)
        assert_match(pytree.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes), 
                     pytree.tree_map(lambda r: torch.zeros_like(r) if isinstance(r, torch.Tensor) else r, ref),
                     f"{op} eval_shape")
    else:
        ours = fn(*jargs, **jkwargs)
    assert_match(ours, ref, str(op), tol)
    if strides and any(isinstance(a, torch.Tensor) and a.ndim >= 2 for a in pytree.tree_leaves((args, kwargs))):
        ref_nc = op(*pytree.tree_map(noncontig, args), **pytree.tree_map(noncontig, kwargs))
        assert_match(ours, ref_nc, f"{op} (non-contiguous torch input)", tol)
