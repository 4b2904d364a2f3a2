"""Bad input raises a specific exception whose text shows the bad value and what is allowed."""
from __future__ import annotations

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
import pytest
from jax.sharding import PartitionSpec as P
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard, _StridedShard

from mesh import Mesh
from xla_dtensor.sharding import (
    DuplicateAxisError,
    NotExpressibleError,
    PendingReductionError,
    PlacementError,
    RankError,
    ShardingError,
    ShardingSpec,
    SpecTypeError,
    UnknownAxisError,
    shard_indices,
)

M = Mesh(range(8), (2, 4), ("dp", "tp"))


def _raises(exc: type, *fragments: str):
    class _Check:
        def __enter__(self):
            self.ctx = pytest.raises(exc)
            self.info = self.ctx.__enter__()
            return self.info

        def __exit__(self, *a):
            out = self.ctx.__exit__(*a)
            msg = str(self.info.value)
            for f in fragments:
                assert f in msg, f"{f!r} not in {msg!r}"
            assert isinstance(self.info.value, ShardingError)
            return out
    return _Check()


def test_axis_used_twice_in_one_dim() -> None:
    with _raises(DuplicateAxisError, "'dp'", "twice in tensor dim 0", "['dp', 'tp']"):
        ShardingSpec.from_partition_spec(M, (("dp", "dp"), None))


def test_axis_on_two_tensor_dims() -> None:
    with _raises(DuplicateAxisError, "'tp'", "tensor dim 0 and tensor dim 1"):
        ShardingSpec.from_partition_spec(M, ("tp", "tp"))
    with _raises(DuplicateAxisError, "'tp'"):
        ShardingSpec.from_partition_spec(M, ("tp", 1))  # the same axis by name and index


def test_axis_not_in_mesh() -> None:
    with _raises(UnknownAxisError, "'model'", "['dp', 'tp']", "tensor dim 1"):
        ShardingSpec.from_partition_spec(M, (None, "model"))
    with _raises(UnknownAxisError, "5", "['dp', 'tp']"):
        ShardingSpec.from_partition_spec(M, (5,))
    with _raises(UnknownAxisError, "'nope'", "['dp', 'tp']"):
        ShardingSpec.from_jax(P("nope"), 1, M)
    assert isinstance(UnknownAxisError("x"), KeyError)


def test_bad_entry_type() -> None:
    with _raises(SpecTypeError, "1.5", "float", "name (str) or an index (int)"):
        ShardingSpec.from_partition_spec(M, (1.5,))
    with _raises(SpecTypeError, "'dp'", "one entry per tensor dim"):
        ShardingSpec.from_partition_spec(M, "dp")
    assert issubclass(SpecTypeError, TypeError)


def test_partition_spec_of_wrong_rank() -> None:
    with _raises(RankError, "('dp', None, None)", "3 entries", "rank 2"):
        ShardingSpec.from_partition_spec(M, ("dp", None, None), ndim=2)
    with _raises(RankError, "3 entries for a rank-2"):
        ShardingSpec.from_jax(P("dp", None, None), 2, M)
    spec = ShardingSpec.from_partition_spec(M, ("dp", None))
    with _raises(RankError, "(4,)", "rank 1", "rank 2"):
        shard_indices(spec, (4,))
    with _raises(RankError, "ndim=3"):
        ShardingSpec.from_hlo("{devices=[2,4]<=[8]}", M, ndim=3)


def test_placements_errors() -> None:
    with _raises(PlacementError, "_StridedShard(dim=0, sf=2)", "not supported"):
        ShardingSpec.from_placements(M, [_StridedShard(0, split_factor=2), Shard(0)], 2)
    with _raises(PlacementError, "Shard(dim=2)", "rank 2", "-2..1"):
        ShardingSpec.from_placements(M, [Shard(2), Replicate()], 2)
    with _raises(RankError, "1 placements", "2-D mesh", "['dp', 'tp']"):
        ShardingSpec.from_placements(M, [Shard(0)], 2)
    with _raises(SpecTypeError, "'S0'", "Shard(d), Replicate(), Partial(op)"):
        ShardingSpec.from_placements(M, ["S0", Replicate()], 2)
    assert ShardingSpec.from_placements(M, [Shard(-1), Replicate()], 2).dim_axes == ((), (0,))


def test_minor_first_split_has_no_placements() -> None:
    spec = ShardingSpec.from_partition_spec(M, (("tp", "dp"),))
    with _raises(NotExpressibleError, "['tp', 'dp']", "mesh-axis order only (['dp', 'tp'])"):
        spec.to_placements()


def test_partial_is_a_pending_reduction() -> None:
    spec = ShardingSpec.from_placements(M, [Partial(), Shard(1)], 2)
    assert spec.is_partial and spec.partial == ((0, "sum"),) and spec.replicated_axes == ()
    assert spec.to_placements() == (Partial(), Shard(1))
    for convert in (spec.to_partition_spec, spec.to_hlo, spec.to_jax_pspec):
        with _raises(PendingReductionError, "{'dp': 'sum'}", "spec.reduced()"):
            convert()
    assert spec.reduced().to_partition_spec() == (None, "tp")
    with _raises(DuplicateAxisError, "'dp'", "tensor dim 0 and partial"):
        ShardingSpec(M, (("dp",),), partial=(("dp", "sum"),))
    with _raises(SpecTypeError, "'mean'", "'sum'"):
        ShardingSpec(M, ((),), partial=(("dp", "mean"),))


def test_from_jax_type_and_mesh_errors() -> None:
    with _raises(SpecTypeError, "needs mesh="):
        ShardingSpec.from_jax(P("dp"), 1)
    with _raises(SpecTypeError, "NamedSharding or PartitionSpec", "'dp'"):
        ShardingSpec.from_jax(("dp",), 1, M)
    from jax.sharding import NamedSharding

    other = Mesh(range(8), (4, 2), ("dp", "tp"))
    with _raises(NotExpressibleError, "differs from the given mesh"):
        ShardingSpec.from_jax(NamedSharding(other.jax_mesh(), P("dp")), 1, M)


def test_hlo_devices_not_in_mesh() -> None:
    small = Mesh(range(4), (4,), ("x",))
    with _raises(NotExpressibleError, "[0, 1, 2, 3, 4, 5, 6, 7]", "[0, 1, 2, 3]"):
        ShardingSpec.from_hlo("{devices=[8]<=[8]}", small)
