"""Matrix product lowerings: mm, bmm, addmm, baddbmm, addbmm, mv, addmv, dot, outer products, grouped mm.

Half-precision products accumulate in float32 (``preferred_element_type``) and round
once, as torch's CPU/CUDA kernels do. ``PRECISION`` is handed to XLA (``None``: JAX's
default, which ``jax.default_matmul_precision`` controls; TPUs then use bf16 passes).

Example:
    >>> import torch, jax.numpy as jnp
    >>> from xla_dtensor.ops.registry import get_lowering
    >>> get_lowering(torch.ops.aten.mm.default)(jnp.ones((2, 3)), jnp.ones((3, 4))).shape
    (2, 4)
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import torch

from xla_dtensor.ops.dtypes import cast, result_type, to_jax, torch_dtype
from xla_dtensor.ops.registry import lowering

aten = torch.ops.aten
PRECISION: Any = None


def _check_same(name: str, *xs: jax.Array) -> torch.dtype:
    dts = {torch_dtype(x) for x in xs}
    if len(dts) != 1:
        raise TypeError(f"{name}: expected all operands to have the same dtype, got {sorted(map(str, dts))}")
    return dts.pop()


def _acc(dt: torch.dtype) -> Any:
    if dt in (torch.float16, torch.bfloat16):
        return jnp.float32
    return None if (dt.is_floating_point or dt.is_complex) else to_jax(dt)


def matmul(a: jax.Array, b: jax.Array, name: str = "matmul", keep_acc: bool = False) -> jax.Array:
    """``a @ b`` (batched) in torch's output dtype with float32 accumulation for half types.

    ``keep_acc`` returns the float32 accumulator of half-type products unrounded.
    """
    dt = _check_same(name, a, b)
    if dt == torch.bool:
        raise TypeError(f"{name}: bool operands are not supported (torch raises too)")
    out = jnp.matmul(a, b, precision=PRECISION, preferred_element_type=_acc(dt))
    return out if keep_acc else out.astype(to_jax(dt))


def _shape_check(name: str, a: jax.Array, b: jax.Array, ranks: tuple[int, int]) -> None:
    if (a.ndim, b.ndim) != ranks:
        raise ValueError(f"{name}: expected operands of rank {ranks}, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ValueError(f"{name}: shapes {a.shape} and {b.shape} cannot be multiplied")


@lowering(aten.mm.default)
def _mm(a: jax.Array, b: jax.Array) -> jax.Array:
    _shape_check("mm", a, b, (2, 2))
    return matmul(a, b, "mm")


@lowering(aten.bmm.default)
def _bmm(a: jax.Array, b: jax.Array) -> jax.Array:
    _shape_check("bmm", a, b, (3, 3))
    return matmul(a, b, "bmm")


@lowering(aten.mv.default)
def _mv(a: jax.Array, v: jax.Array) -> jax.Array:
    _shape_check("mv", a, v, (2, 1))
    return matmul(a, v, "mv")


@lowering(aten.dot.default, aten.vdot.default)
def _dot(a: jax.Array, b: jax.Array) -> jax.Array:
    _shape_check("dot", a, b, (1, 1))
    return matmul(a, b, "dot")


@lowering(aten.matmul.default)
def _matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    return matmul(a, b, "matmul")


def _scaled_add(name: str, bias: Any, prod: jax.Array, beta: Any, alpha: Any, dt: torch.dtype | None = None) -> jax.Array:
    dt = dt or torch_dtype(prod)
    if torch_dtype(bias) != dt:
        raise TypeError(f"{name}: bias dtype {torch_dtype(bias)} differs from the product's {dt}")
    acc = jnp.float32 if dt in (torch.float16, torch.bfloat16) else to_jax(dt)
    out = prod.astype(acc)
    if not (isinstance(alpha, (int, float)) and alpha == 1):
        out = out * cast(alpha, torch_dtype(out))
    if isinstance(beta, (int, float)) and beta == 0:
        return out.astype(to_jax(dt))  # torch ignores (even NaN) bias when beta == 0
    b = cast(bias, torch_dtype(out))
    if not (isinstance(beta, (int, float)) and beta == 1):
        b = b * cast(beta, torch_dtype(out))
    return (out + b).astype(to_jax(dt))


def _add_product(name: str, ranks: tuple[int, int]) -> Callable[..., jax.Array]:
    """``beta * bias + alpha * (a @ b)`` for ``addmm`` / ``addmv`` / ``baddbmm`` (operand ``ranks``)."""
    def lower(bias: jax.Array, a: jax.Array, b: jax.Array, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
        _shape_check(name, a, b, ranks)
        return _scaled_add(name, bias, matmul(a, b, name, keep_acc=True), beta, alpha, torch_dtype(a))
    lower.__name__ = f"_{name}"
    return lower


_addmm = lowering(aten.addmm.default)(_add_product("addmm", (2, 2)))
lowering(aten.addmv.default)(_add_product("addmv", (2, 1)))
lowering(aten.baddbmm.default)(_add_product("baddbmm", (3, 3)))


@lowering(aten.addbmm.default)
def _addbmm(bias: jax.Array, a: jax.Array, b: jax.Array, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    _shape_check("addbmm", a, b, (3, 3))
    dt = _check_same("addbmm", a, b)
    prod = jnp.einsum("bij,bjk->ik", a, b, precision=PRECISION, preferred_element_type=_acc(dt))
    return _scaled_add("addbmm", bias, prod, beta, alpha, dt)


@lowering(aten.addr.default)
def _addr(bias: jax.Array, u: jax.Array, v: jax.Array, *, beta: Any = 1, alpha: Any = 1) -> jax.Array:
    dt = result_type(u, v)
    prod = jnp.outer(cast(u, dt), cast(v, dt))
    if dt == torch.bool:
        return jnp.logical_or(prod & bool(alpha), cast(bias, dt) & bool(beta))
    return _scaled_add("addr", cast(bias, dt), prod, beta, alpha)


@lowering(aten._addmm_activation.default)
def _addmm_activation(bias: jax.Array, a: jax.Array, b: jax.Array, *, beta: Any = 1, alpha: Any = 1,
                      use_gelu: bool = False) -> jax.Array:
    out = _addmm(bias, a, b, beta=beta, alpha=alpha)
    return jax.nn.gelu(out, approximate=False) if use_gelu else jax.nn.relu(out)


def _group_sizes(offs: jax.Array) -> jax.Array:
    """Group sizes from torch's cumulative ``offs`` (group ``i`` ends at ``offs[i]``)."""
    o = offs.astype(jnp.int32)
    return jnp.diff(o, prepend=jnp.zeros((1,), jnp.int32))


def _ragged(a: jax.Array, b: jax.Array, sizes: jax.Array, dims: tuple, lhs_ragged: int, rhs_group: list[int],
            acc: Any) -> jax.Array:
    nums = jax.lax.RaggedDotDimensionNumbers(dot_dimension_numbers=dims, lhs_ragged_dimensions=[lhs_ragged],
                                             rhs_group_dimensions=rhs_group)
    return jax.lax.ragged_dot_general(a, b, sizes, nums, precision=PRECISION, preferred_element_type=acc)


@lowering(aten._grouped_mm.default)
def _grouped_mm(a: jax.Array, b: jax.Array, offs: jax.Array | None = None, bias: jax.Array | None = None,
                out_dtype: torch.dtype | None = None) -> jax.Array:
    """torch's grouped matmul (MoE experts) as XLA's ragged dot.

    ``offs`` (cumulative group ends) splits: 2d x 3d, the rows of ``a`` (group ``i`` uses
    ``b[i]``; output ``(M, N)``); 2d x 2d, the shared ``K`` (output ``(G, M, N)``, the
    expert-weight gradient); 3d x 2d, the columns of ``b`` (output ``(M, N)``). Without
    ``offs`` both are 3d: a batched matmul. Rows (columns, groups) past ``offs[-1]`` are
    zeros (torch leaves them unwritten).
    """
    if bias is not None:
        raise RuntimeError("_grouped_mm: bias is not supported (torch's kernels raise 'Bias not supported yet')")
    dt = _check_same("_grouped_mm", a, b)
    acc = _acc(dt)
    if offs is None:
        out = jnp.matmul(a, b, precision=PRECISION, preferred_element_type=acc)
    else:
        sizes = _group_sizes(offs)
        if a.ndim == 2 and b.ndim == 3:
            out = _ragged(a, b, sizes, (([1], [1]), ([], [])), 0, [0], acc)
        elif a.ndim == 2 and b.ndim == 2:
            out = _ragged(a, b, sizes, (([1], [0]), ([], [])), 1, [], acc)
        elif a.ndim == 3 and b.ndim == 2:  # out.T = b.T (ragged rows) x a.T per group
            out = _ragged(b.T, jnp.swapaxes(a, 1, 2), sizes, (([1], [1]), ([], [])), 0, [0], acc).T
        else:
            raise ValueError(f"_grouped_mm: operands of rank 2 or 3 with offs, got shapes {a.shape} and {b.shape}")
    return out.astype(to_jax(out_dtype or dt))
