"""torch's tensor-parallel styles (``torch.distributed.tensor.parallel``) under SPMD.

Every style runs torch's own code. The pieces it is built from work on an ``"xla"``
mesh as they do on GPUs: ``DTensor.from_local`` and ``redistribute`` become sharding
constraints on the global activations (:mod:`xla_dtensor.spmd.relayout`), parameters
are distributed by ``distribute_tensor``, and ``to_local()`` hands the global value on.
So ``SequenceParallel``, ``PrepareModuleInput`` / ``PrepareModuleOutput`` /
``PrepareModuleInputOutput`` and the input side of ``ColwiseParallel`` /
``RowwiseParallel`` need nothing here.

One piece needs a translation: the output functions of ``ColwiseParallel`` and
``RowwiseParallel`` compare ``outputs.placements`` with the wanted layout. A DTensor
knows its placements from its local op; a lazy value's layout is only decided when XLA
compiles the step, and reading it would run the step half-way. Those two functions
are recognised (``distribute_module`` hands them here) and replaced by the layout change
torch would make from the layout torch knows the linear produces:

* ``ColwiseParallel``: the output is ``Shard(-1)``; it is laid out as ``output_layouts``
  and its gradient as ``Shard(-1)``;
* ``RowwiseParallel``: the output is ``Partial()``, a pending reduction; laying it out as
  ``Replicate()`` makes XLA all-reduce; as ``Shard(d)`` (sequence parallel) the value is
  computed as a local product and an explicit reduce-scatter
  (:mod:`xla_dtensor.spmd.reduce_scatter`; a constraint where that does not apply); its
  gradient is replicated (all-gathered from ``Shard(d)``).

The replacement reads the module's inputs as well (``takes_inputs``: ``distribute_module``
passes them).

The input functions of ``ColwiseParallel``, ``RowwiseParallel`` and ``SequenceParallel``
(and ``PrepareModuleInput`` / ``PrepareModuleOutput``, wrapped by
:mod:`xla_dtensor._torch_hook`) branch on ``isinstance(x, DTensor)``. Our sharded tensors
are DTensors, and an op's result on a sharded parameter is one whose layout XLA has not
decided yet: the DTensor branch would read its ``placements`` (running the step
half-way) or skip the layout the style declares. So those functions get the value as a
plain lazy tensor (:func:`as_plain`) and take their ``from_local`` branch: a constraint
to the declared layout, as for any tensor.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from xla_dtensor.core.tensor import LazyTensor
from xla_dtensor.sharding import ShardingSpec
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd import reduce_scatter as RS
from xla_dtensor.spmd import relayout as R
from xla_dtensor.spmd.sharded_tensor import XLAShardedTensor


def as_plain(x: Any) -> Any:
    """``x`` as a plain (non-DTensor) lazy tensor sharing its storage, if it is a sharded
    tensor; differentiable, the gradient left to the partitioner. Anything else as it is."""
    if isinstance(x, XLAShardedTensor):
        return R.Alias.apply(x, None)
    if isinstance(x, tuple):
        return tuple(as_plain(y) for y in x)
    return x


def _plain_inputs(fn: Callable[..., Any]) -> Callable[..., Any]:
    def input_fn(mod: Any, inputs: Any, mesh: Any) -> Any:
        return fn(mod, as_plain(inputs), mesh)
    return input_fn


def translate(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself, or the SPMD replacement of a Colwise/Rowwise output function, or a
    Colwise/Rowwise/SequenceParallel input function that sees plain tensors (module doc)."""
    if not isinstance(fn, functools.partial):
        return fn
    from torch.distributed.tensor import Partial, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel
    if fn.func in (ColwiseParallel._prepare_input_fn, RowwiseParallel._prepare_input_fn,
                   SequenceParallel._prepare_input_fn):
        return _plain_inputs(fn)
    if len(fn.args) != 2:
        return fn
    source = {ColwiseParallel._prepare_output_fn: Shard(-1),
              RowwiseParallel._prepare_output_fn: Partial()}.get(fn.func)
    if source is None:
        return fn
    layouts, use_local = fn.args

    def output_fn(mod: Any, outputs: Any, mesh: Any, inputs: tuple = ()) -> Any:
        return _output(mod, inputs, outputs, mesh, source, layouts, use_local)
    output_fn.takes_inputs = True  # type: ignore[attr-defined]
    return output_fn


def _output(mod: Any, inputs: tuple, outputs: Any, mesh: Any, source: Any, layouts: Any, use_local: bool) -> Any:
    if not isinstance(outputs, LazyTensor):
        return outputs
    m = A.as_mesh(mesh)
    src = ShardingSpec.from_placements(m, [source], outputs.dim())
    dst = ShardingSpec.from_placements(m, _as_list(layouts), outputs.dim())
    value = _scattered(mod, inputs, outputs, mesh, source, _as_list(layouts))
    moved = R.Relayout.apply(outputs, dst, src.reduced()) if value is None else \
        R.Recompute.apply(outputs, value, src.reduced())
    out = XLAShardedTensor.wrap(moved)._record(dst, mesh)
    return out.to_local() if use_local else out


def _scattered(mod: Any, inputs: tuple, outputs: LazyTensor, mesh: Any, source: Any, layouts: list[Any]) -> Any:
    """A partial-sum output laid out ``Shard(d)``, as a local product and a reduce-scatter (or ``None``)."""
    from torch.distributed.tensor import Partial, Shard
    if not isinstance(source, Partial) or len(layouts) != 1 or type(layouts[0]) is not Shard:
        return None
    return RS.scattered_value(mod, inputs, tuple(outputs.shape), layouts[0].dim, mesh)


def constrain_activation(x: LazyTensor, mesh: Any, placements: Any) -> LazyTensor:
    """``x`` (differentiably) constrained to ``placements`` on ``mesh``; a plain lazy tensor.

    Like ``DTensor.from_local(x, mesh, placements).to_local()``, except that the gradient
    is left to the partitioner (FSDP's batch split and AUTO's activation layouts use it). On a
    sub-mesh (``mesh["tp"]``) the dims the placements leave whole are left to the
    partitioner, so the other mesh axes (say a batch split on ``"dp"``) keep what
    propagation gives them.

    Example:
        >>> import torch, xla_dtensor
        >>> from torch.distributed.tensor import Shard
        >>> from mesh import Mesh
        >>> y = constrain_activation(torch.ones(8, 4).to(xla_dtensor.device()), Mesh(range(8), (8,), ("x",)), Shard(0))
        >>> tuple(y.shape), type(y).__name__
        ((8, 4), 'LazyTensor')
    """
    return R.Relayout.apply(x, layout_of_placements(mesh, placements, x.dim()), None)


def layout_of_placements(mesh: Any, placements: Any, ndim: int) -> ShardingSpec:
    """The layout :func:`constrain_activation` holds an ``ndim``-dim tensor to."""
    return ShardingSpec.from_placements(A.as_mesh(mesh), _as_list(placements), ndim)


def _as_list(placements: Any) -> list[Any]:
    return list(placements) if isinstance(placements, (list, tuple)) else [placements]
