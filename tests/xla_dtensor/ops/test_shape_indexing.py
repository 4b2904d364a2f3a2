"""View/shape and indexing lowerings against torch CPU eager."""
from __future__ import annotations

import pytest
import torch

from tests.xla_dtensor.ops.harness import T, check

aten = torch.ops.aten
f32, bf16, i64, b = torch.float32, torch.bfloat16, torch.int64, torch.bool


@pytest.mark.parametrize("dtype", [f32, i64, b])
def test_views(dtype: torch.dtype) -> None:
    x = T(2, 3, 4, dtype=dtype)
    check(aten.view.default, x, [6, -1], strides=False)  # torch's view needs compatible strides
    check(aten._unsafe_view.default, x, [24], strides=False)
    check(aten.permute.default, x, [2, 0, 1])
    check(aten.transpose.int, x, -1, 0)
    check(aten.t.default, x[0])
    check(aten.t.default, T(3, dtype=dtype))
    check(aten.expand.default, T(3, 1, dtype=dtype), [2, 3, 5])
    check(aten.expand.default, T(3, 1, dtype=dtype), [-1, 4])
    check(aten.slice.Tensor, x, 1, 1, 3)
    check(aten.slice.Tensor, x, -1, 0, 100, 2)
    check(aten.slice.Tensor, x, 0, -1, None)
    check(aten.slice.Tensor, x, 2, 3, 1)  # empty
    check(aten.select.int, x, 1, -1)
    check(aten.squeeze.dim, T(2, 1, 3, dtype=dtype), 1)
    check(aten.squeeze.dims, T(1, 2, 1, dtype=dtype), [0, 1, 2])
    check(aten.squeeze.default, T(1, 2, 1, dtype=dtype))
    check(aten.unsqueeze.default, x, -1)
    check(aten.unsqueeze.default, T(dtype=dtype), 0)
    check(aten.alias.default, x)
    check(aten.detach.default, x)
    check(aten.clone.default, x)
    check(aten.flip.default, x, [0, 2])
    check(aten.roll.default, x, [1, -2], [0, 2])
    check(aten.roll.default, x, [3])
    check(aten.repeat.default, T(2, 3, dtype=dtype), [2, 1, 3])
    check(aten.diagonal.default, x, 1, 1, 2)
    check(aten.unfold.default, T(2, 7, dtype=dtype), 1, 3, 2)
    check(aten.narrow.default, x, 2, 1, 2)


def test_cat_stack_split() -> None:
    a, c = T(2, 3), T(4, 3, dtype=bf16)
    check(aten.cat.default, [a, c])
    check(aten.cat.default, [a, T(2, 5, dtype=i64)], 1)
    check(aten.cat.default, [a, torch.empty(0), a], 0)  # legacy empty 1-d tensors are skipped
    check(aten.stack.default, [a, a.to(i64)], 1)
    check(aten.stack.default, [a, a], -1)
    check(aten.split.Tensor, T(7, 3), 3)
    check(aten.split.Tensor, T(2, 6), 2, -1)
    check(aten.split_with_sizes.default, T(2, 6), [1, 0, 5], 1)
    check(aten.unbind.int, T(3, 2), 1)
    check(aten.constant_pad_nd.default, T(2, 3), [1, 2])
    check(aten.constant_pad_nd.default, T(2, 3, 4), [1, 0, -1, 2], 1.5)
    check(aten.constant_pad_nd.default, T(2, 3, dtype=i64), [0, 1, 1, 1], 7)


def test_as_strided_on_contiguous_storage() -> None:
    x = T(4, 5)
    check(aten.as_strided.default, x, [3, 2], [1, 5], 2, strides=False)


@pytest.mark.parametrize("dtype", [f32, i64])
def test_index_and_index_put(dtype: torch.dtype) -> None:
    x = T(4, 5, 3, dtype=dtype)
    i0, i1 = torch.tensor([0, 3, -1]), torch.tensor([[1], [4]])
    check(aten.index.Tensor, x, [i0])
    check(aten.index.Tensor, x, [None, i1])
    check(aten.index.Tensor, x, [i0[:2], None, torch.tensor([2, 0])])  # non-adjacent: dims go first
    check(aten.index.Tensor, x, [i1 - 1, torch.tensor([0, 1, 2])])
    check(aten.index.Tensor, x, [T(4, dtype=b)])  # bool mask on concrete arrays
    v = T(3, 3, dtype=dtype)
    check(aten.index_put.default, x, [torch.tensor([0, 2, 3]), torch.tensor([1, 1, 4])], v)
    check(aten.index_put.default, x, [torch.tensor([0, 0, 3])], T(3, dtype=dtype), True)
    check(aten.index_put.default, x, [None, torch.tensor([1, 3])], T(1, dtype=dtype), True)


def test_bool_index_under_trace_is_a_clear_error() -> None:
    import jax
    import jax.numpy as jnp
    from xla_dtensor.ops import get_lowering
    fn = get_lowering(aten.index.Tensor)
    with pytest.raises(NotImplementedError, match="boolean mask"):
        jax.jit(lambda x, m: fn(x, [m]))(jnp.ones(3), jnp.ones(3, jnp.bool_))


def test_gather_scatter() -> None:
    x = T(3, 5)
    idx = torch.tensor([[0, 4], [2, 2], [1, 3]])
    check(aten.gather.default, x, 1, idx)
    check(aten.gather.default, x, 0, torch.tensor([[0, 2, 1, 1, 0]]))
    check(aten.gather.default, x, 1, torch.zeros(2, 0, dtype=i64))
    src = T(3, 5)
    uniq = torch.stack([torch.randperm(5)[:2] for _ in range(3)])
    check(aten.scatter.src, x, 1, uniq, src)
    check(aten.scatter.value, x, 1, uniq, 2.5)
    check(aten.scatter.reduce, x, 1, idx, src, reduce="add")
    check(aten.scatter.reduce, x, 1, idx, src, reduce="multiply")
    check(aten.scatter_add.default, x, 1, idx, src)
    check(aten.scatter_add.default, T(3, 5, dtype=i64), 0, torch.tensor([[0, 1, 2, 0, 0]]), T(1, 5, dtype=i64))
    for red in ["sum", "prod", "mean", "amax", "amin"]:
        for inc in [True, False]:
            check(aten.scatter_reduce.two, x, 1, idx, src, red, include_self=inc)
    check(aten.scatter_reduce.two, T(3, 5, dtype=i64), 1, idx, T(3, 2, dtype=i64), "mean")


def test_index_select_add_copy_fill_embedding() -> None:
    x = T(4, 3, dtype=bf16)
    idx = torch.tensor([3, 0, 3])
    check(aten.index_select.default, x, 0, idx)
    check(aten.index_select.default, x, 1, torch.tensor(2))
    check(aten.index_add.default, x, 0, idx, T(3, 3, dtype=bf16), alpha=2)
    check(aten.index_copy.default, T(4, 3), 0, torch.tensor([2, 0]), T(2, 3))
    check(aten.index_fill.int_Scalar, T(4, 3), 1, torch.tensor([0, 2]), -1.0)
    w = T(10, 4)
    ids = torch.tensor([[1, 2, 2], [9, 0, 1]])
    check(aten.embedding.default, w, ids)
    g = T(2, 3, 4)
    check(aten.embedding_dense_backward.default, g, ids, 10, -1, False)
    check(aten.embedding_dense_backward.default, g, ids, 10, 2, False)
    check(aten.embedding_dense_backward.default, g, ids, 10, -1, True)
    check(aten.embedding_dense_backward.default, T(2, 3, 4, dtype=bf16), ids, 10, -1, False)


def test_scatter_views_and_backward() -> None:
    x = T(3, 4, 5)
    check(aten.select_scatter.default, x, T(3, 5), 1, -1)
    check(aten.slice_scatter.default, x, T(3, 4, 2), 2, 1, 5, 2)
    check(aten.diagonal_scatter.default, T(4, 5), T(4), 1)
    check(aten.select_backward.default, T(3, 5), [3, 4, 5], 1, 2)
    check(aten.slice_backward.default, T(3, 2, 5), [3, 4, 5], 1, 1, 4, 2)
    check(aten.masked_scatter.default, T(3, 4), T(3, 4, dtype=b), T(12))
