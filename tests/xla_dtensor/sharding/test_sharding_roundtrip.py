"""Round trips partition spec <-> placements <-> PartitionSpec <-> HLO, checked against JAX.

The oracle for every case is what JAX itself produces for the hand-written
``PartitionSpec``: ``NamedSharding._to_xla_hlo_sharding(ndim)`` and
``NamedSharding.devices_indices_map(shape)``; for placements, DTensor's own
``_compute_local_shape_and_global_offset``.
"""
from __future__ import annotations

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from torch.distributed.tensor._utils import _compute_local_shape_and_global_offset

from _sharding_cases import CASES, MESHES, Case
from xla_dtensor.sharding import HloSharding, NotExpressibleError, ShardingSpec, shard_indices


def _jax(case: Case) -> tuple[NamedSharding, object]:
    ns = NamedSharding(MESHES[case.mesh].jax_mesh(), case.pspec)
    return ns, ns._to_xla_hlo_sharding(len(case.shape))


def _jax_device_ids(ns: NamedSharding, hlo: object) -> list[int]:
    """JAX numbers devices by position in the mesh; map positions to device ids."""
    order = [d.id for d in ns._device_assignment]
    return [order[i] for i in hlo.tile_assignment_devices()]


def _norm(idx: tuple[slice, ...], shape: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    return tuple(s.indices(n)[:2] for s, n in zip(idx, shape))


def _jax_indices(ns: NamedSharding, shape: tuple[int, ...]) -> dict[int, tuple]:
    return {d.id: _norm(idx, shape) for d, idx in ns.devices_indices_map(shape).items()}


def _identity_order(m: mesh.Mesh) -> bool:
    return list(m.device_ids) == list(range(m.size()))


def test_table_is_large_enough() -> None:
    assert len(CASES) >= 30


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hlo_matches_jax(case: Case) -> None:
    spec = ShardingSpec.from_partition_spec(MESHES[case.mesh], case.spec, len(case.shape))
    ns, want = _jax(case)
    mine = spec.to_hlo()
    if want.is_replicated():
        assert mine.is_replicated and str(mine) == "{replicated}" == str(want)
        return
    want_dims = list(want.tile_assignment_dimensions())
    assert list(mine.tile_shape) + ([mine.replicas] if mine.replicas > 1 else []) == want_dims
    assert list(mine.devices) == _jax_device_ids(ns, want)
    assert (mine.replicas > 1) == want.replicate_on_last_tile_dim()
    if _identity_order(spec.mesh):  # there JAX's positions are our device ids
        assert str(mine) == str(want)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_hlo_string_round_trip(case: Case) -> None:
    m = MESHES[case.mesh]
    ns, want = _jax(case)
    # JAX numbers mesh positions, not device ids: on other meshes use our string, whose
    # devices test_hlo_matches_jax checks against JAX's
    spec = ShardingSpec.from_partition_spec(m, case.spec)
    text = str(want) if _identity_order(m) else str(spec.to_hlo())
    parsed = HloSharding.parse(text)
    if not want.is_replicated() and _identity_order(m):
        assert list(parsed.tile_shape) + ([parsed.replicas] if parsed.replicas > 1 else []) == \
            list(want.tile_assignment_dimensions())
        assert list(parsed.devices) == list(want.tile_assignment_devices())
    back = ShardingSpec.from_hlo(text, m, len(case.shape))
    assert back == spec
    assert str(back.to_hlo()) == text


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_jax_round_trip(case: Case) -> None:
    m = MESHES[case.mesh]
    spec = ShardingSpec.from_partition_spec(m, case.spec, len(case.shape))
    ns, _ = _jax(case)
    own = ShardingSpec.from_jax(ns, len(case.shape))  # a plain Mesh built from JAX's mesh
    assert (own.dim_axes, own.mesh.device_ids, own.mesh.mesh_shape) == \
        (spec.dim_axes, m.device_ids, m.mesh_shape)
    assert ShardingSpec.from_jax(ns, len(case.shape), m) == spec
    assert ShardingSpec.from_jax(case.pspec, len(case.shape), m) == spec
    ours = spec.to_named_sharding()
    assert ours.is_equivalent_to(ns, len(case.shape))
    assert spec.to_partition_spec() == case.spec
    assert spec.to_jax_pspec() == jax.sharding.PartitionSpec(
        *case.pspec, *(None,) * (len(case.shape) - len(case.pspec)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_indices_match_jax(case: Case) -> None:
    spec = ShardingSpec.from_partition_spec(MESHES[case.mesh], case.spec, len(case.shape))
    ns, want = _jax(case)
    expected = _jax_indices(ns, case.shape)
    for sharding in (spec, spec.to_hlo()):
        got = shard_indices(sharding, case.shape, device_ids=spec.mesh.device_ids)
        assert {d: _norm(i, case.shape) for d, i in got.items()} == expected


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_placements_match_dtensor(case: Case) -> None:
    m = MESHES[case.mesh]
    spec = ShardingSpec.from_partition_spec(m, case.spec, len(case.shape))
    if any(list(a) != sorted(a) for a in spec.dim_axes):
        with pytest.raises(NotExpressibleError, match="mesh-axis order"):
            spec.to_placements()
        return
    placements = spec.to_placements()
    assert ShardingSpec.from_placements(m, placements, len(case.shape)) == spec
    ns, _ = _jax(case)
    expected = _jax_indices(ns, case.shape)
    grid = m.get_logical_mesh()
    for coord in np.ndindex(grid.shape):
        size, offset = _compute_local_shape_and_global_offset(case.shape, m.mesh_shape,
                                                              list(coord), placements)
        got = tuple((o, o + s) for o, s in zip(offset, size))
        assert got == expected[int(grid[coord])]


def test_sub_mesh_maps_to_root() -> None:
    root = MESHES["ab24"]
    spec = ShardingSpec.from_partition_spec(MESHES["sub4"], ("b", None))
    on_root = spec.on_root()
    assert on_root == ShardingSpec.from_partition_spec(root, ("b", None))
    ns = NamedSharding(root.jax_mesh(), jax.sharding.PartitionSpec("b"))
    assert str(on_root.to_hlo()) == str(ns._to_xla_hlo_sharding(2))


_COMPILED = [CASES[6], CASES[7], CASES[23]]  # ("b","a"), (None,"b"), (("c","a"),"b")


@pytest.fixture(scope="module")
def compiled_shardings() -> dict[str, str]:
    """Output shardings in the HLO text of a few compiled programs (3 compiles)."""
    import re

    out = {}
    for case in _COMPILED:
        ns, _ = _jax(case)
        fn = jax.jit(lambda x: x + 1, out_shardings=ns)
        text = fn.lower(jax.ShapeDtypeStruct(case.shape, np.float32)).compile().as_text()
        root = [ln for ln in text.splitlines() if "ROOT" in ln and "sharding=" in ln] or \
               [ln for ln in text.splitlines() if "parameter(0)" in ln and "sharding=" in ln]
        out[case.id] = re.search(r"sharding=(\{[^}]*\})", root[0]).group(1)
    return out


@pytest.mark.parametrize("case", _COMPILED, ids=lambda c: c.id)
def test_compiled_hlo_sharding(case: Case, compiled_shardings: dict[str, str]) -> None:
    spec = ShardingSpec.from_partition_spec(MESHES[case.mesh], case.spec)
    text = compiled_shardings[case.id]
    assert str(spec.to_hlo()) == text
    assert ShardingSpec.from_hlo(text, spec.mesh) == spec
