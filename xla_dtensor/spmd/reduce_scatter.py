"""A row-split product laid out sharded, as an explicit local product and reduce-scatter.

``RowwiseParallel(output_layouts=Shard(d))`` (torch's sequence-parallel plan) lays out a
``Partial`` output (each device holds a partial sum) as a shard of the sum. A sharding
constraint on the product leaves the collective to XLA, and XLA's CPU pipeline writes it
as an all-reduce whose result each device slices: it has no pass that turns that pair
into a ``reduce-scatter`` (the GPU pipeline does). :func:`scattered_value` computes the
same value as a ``shard_map`` instead. Each device multiplies (or looks up) its own
pieces and ``psum_scatter`` sums them into its shard, so every backend runs a real
reduce-scatter, as torch's DTensor does.

Only the forward value is computed this way. The caller gives the tensor the module's
own autograd history (:class:`~xla_dtensor.spmd.relayout.Recompute`), so torch's
linear / embedding backward runs on a gradient laid out as DTensor lays it.

When it applies (else ``None``, and the caller keeps the constraint; values are equal):

* ``nn.Linear`` or ``nn.Embedding`` running torch's own ``forward`` (an embedding
  without ``max_norm``), on one tensor input;
* the weight laid out as ``RowwiseParallel`` places it: a linear's ``Shard(1)``, an
  embedding's ``Shard(0)``, on the axis the output is sharded over;
* every split dim divides by its axis size;
* on a mesh with other axes larger than 1 (say ``"dp"`` next to ``"tp"``): the output has
  a leading batch dim, other than ``d``, that divides by them. The ``shard_map`` splits
  that dim over them, as each ``dp`` rank holds its own batch in torch's DP+TP (an input
  replicated over them is sliced locally).

Example:
    >>> import torch, xla_dtensor
    >>> from torch.distributed.device_mesh import init_device_mesh
    >>> from torch.distributed.tensor import Shard
    >>> from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module
    >>> dm = init_device_mesh("xla", (8,))
    >>> lin = parallelize_module(torch.nn.Linear(16, 4), dm, RowwiseParallel(output_layouts=Shard(1)))
    >>> x = torch.ones(2, 8, 16).to(xla_dtensor.device())
    >>> scattered_value(lin, (x,), (2, 8, 4), 1, dm).op
    'rowwise_reduce_scatter'
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from math import prod
from typing import Any, Callable

import jax
import jax.numpy as jnp
from torch import nn

from mesh import Mesh
from xla_dtensor.core.ir import Node, make_node
from xla_dtensor.core.tensor import LazyTensor, value_of
from xla_dtensor.ops.matmul import matmul
from xla_dtensor.spmd import annotate as A

OP = "rowwise_reduce_scatter"
_P = jax.sharding.PartitionSpec


@dataclass(frozen=True)
class Scatter:
    """What one node computes: ``kind`` (``"linear"``/``"embedding"``) on the JAX ``mesh``,
    summed over the axes ``tp`` into shards of output dim ``dim`` (of ``ndim``), dim 0 split
    over ``batch`` (the mesh's other axes; ``()``: none), a bias added when ``bias``."""

    kind: str
    mesh: jax.sharding.Mesh
    tp: tuple[str, ...]
    batch: tuple[str, ...]
    dim: int
    ndim: int
    bias: bool = False

    def out_spec(self) -> jax.sharding.PartitionSpec:
        return _P(*[self.tp if i == self.dim else self.batch if i == 0 and self.batch else None
                    for i in range(self.ndim)])

    def in_spec(self, ndim: int, last: tuple[str, ...] | None) -> jax.sharding.PartitionSpec:
        """An input of rank ``ndim``: dim 0 over ``batch``, the last dim over ``last``."""
        return _P(*[last if i == ndim - 1 and last else self.batch if i == 0 and self.batch else None
                    for i in range(ndim)])


def scattered_value(mod: nn.Module, inputs: tuple, shape: tuple[int, ...], dim: int, mesh: Any) -> Node | None:
    """The value of ``mod(*inputs)`` (of ``shape``) laid out ``Shard(dim)`` on the 1-D ``mesh``,
    computed as a local product and a reduce-scatter; ``None`` where that does not apply
    (module doc)."""
    kind = _kind(mod)
    x = inputs[0] if len(inputs) == 1 else None
    if kind is None or not isinstance(x, LazyTensor) or not isinstance(mod.weight, LazyTensor):
        return None
    if (x.dtype == mod.weight.dtype) != (kind == "linear") or x.dtype.is_complex:
        return None  # a linear of one dtype, an embedding of integer ids (torch raised otherwise)
    m = A.as_mesh(mesh)
    if m.ndim != 1:
        return None
    split = 1 if kind == "linear" else 0
    if not _weight_split_on(mod.weight, m, split):
        return None
    root, group = m.root, m.root_axis_groups[0]
    names = root.jax_axis_names
    others = tuple(a for a in range(root.ndim) if a not in group and root.mesh_shape[a] > 1)
    out_shape = tuple(x.shape[:-1]) + (mod.weight.shape[0],) if kind == "linear" else \
        tuple(x.shape) + (mod.weight.shape[1],)
    if out_shape != tuple(shape):
        return None
    dim = dim % len(out_shape)
    if not _divides(out_shape, dim, mod.weight.shape[split], m.size(), prod(root.mesh_shape[a] for a in others)):
        return None
    bias = kind == "linear" and mod.bias is not None
    if bias and not isinstance(mod.bias, LazyTensor):
        return None
    s = Scatter(kind, root.jax_mesh(), tuple(names[a] for a in group), tuple(names[a] for a in others),
                dim, len(out_shape), bias)
    args = (value_of(x), value_of(mod.weight)) + ((value_of(mod.bias),) if bias else ())
    key = (OP, s)
    return make_node(OP, key, hash(key), args, _fn(s))


def _kind(mod: nn.Module) -> str | None:
    if isinstance(mod, nn.Linear) and type(mod).forward is nn.Linear.forward:
        return "linear"
    if isinstance(mod, nn.Embedding) and type(mod).forward is nn.Embedding.forward and mod.max_norm is None:
        return "embedding"
    return None


def _weight_split_on(w: LazyTensor, m: Mesh, dim: int) -> bool:
    """Whether ``w`` is laid out with ``dim`` split over exactly ``m``'s axis (other root
    axes may split its other dim, as FSDP does)."""
    spec = A.sticky_spec(w)
    if spec is None or spec.is_partial or spec.mesh.root != m.root or w.dim() != 2:
        return False
    axes = spec.on_root().dim_axes
    return axes[dim] == m.root_axis_groups[0] and not set(axes[1 - dim]) & set(axes[dim])


def _divides(out_shape: tuple[int, ...], dim: int, split: int, tp: int, batch: int) -> bool:
    if out_shape[dim] % tp or split % tp:
        return False
    if batch == 1:
        return True
    return len(out_shape) > 2 and dim != 0 and out_shape[0] % batch == 0


@functools.lru_cache(maxsize=256)
def _fn(s: Scatter) -> Callable[..., jax.Array]:
    """The node's JAX function for ``s`` (one per kind of call, so programs trace alike)."""
    def scatter(y: jax.Array) -> jax.Array:
        return jax.lax.psum_scatter(y, s.tp, scatter_dimension=s.dim, tiled=True)

    if s.kind == "linear":
        def local(x: jax.Array, w: jax.Array) -> jax.Array:
            return scatter(matmul(x, w.T, "linear"))
        specs = (s.in_spec(s.ndim, s.tp), _P(None, s.tp))
    else:
        def local(ids: jax.Array, w: jax.Array) -> jax.Array:
            rows = w.shape[0]
            at = ids - jax.lax.axis_index(s.tp) * rows
            mine = (at >= 0) & (at < rows)
            picked = jnp.take(w, jnp.where(mine, at, 0), axis=0)
            return scatter(jnp.where(mine[..., None], picked, jnp.zeros((), picked.dtype)))
        specs = (s.in_spec(s.ndim - 1, None), _P(s.tp, None))
    body = jax.shard_map(local, mesh=s.mesh, in_specs=specs, out_specs=s.out_spec())
    if s.bias:
        return lambda x, w, b: body(x, w) + b
    return body
