"""HLO sharding strings: parsing and printing checked against XLA's own HloSharding."""
from __future__ import annotations

import itertools

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
import numpy as np
import pytest
from jax._src.lib import xla_client as xc

from mesh import Mesh
from xla_dtensor.sharding import (
    HloParseError,
    HloSharding,
    NotExpressibleError,
    RankError,
    ShardingSpec,
    iota_form,
    shard_indices,
)

STRINGS = [
    "{replicated}",
    "{maximal device=3}",
    "{devices=[2,4]0,1,2,3,4,5,6,7}",
    "{devices=[2,2]3,2,1,0}",
    "{devices=[2,1,4]0,1,2,3,4,5,6,7 last_tile_dim_replicate}",
    "{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
    "{devices=[2,4]<=[8]}",
    "{devices=[8]<=[8]}",
    "{devices=[2,2,2]<=[2,2,2]T(2,0,1)}",
    "{devices=[2,2,2]<=[2,2,2]T(2,1,0)}",
    "{devices=[4,2]5,1,7,3,0,2,4,6}",
    "{devices=[1,2,4]<=[8] last_tile_dims={replicated}}",
    "{devices=[3]4,5,6}",
]


def _xla_tiles(x: object) -> tuple[list[int], list[int]]:
    return list(x.tile_assignment_dimensions()), list(x.tile_assignment_devices())


@pytest.mark.parametrize("text", STRINGS)
def test_parse_matches_xla(text: str) -> None:
    ours, xla = HloSharding.parse(text), xc.HloSharding.from_string(text)
    assert ours.is_maximal == (xla.is_maximal() and not xla.is_replicated())
    if xla.is_replicated():
        assert ours.is_replicated and not ours.is_tiled
    elif ours.is_maximal:
        assert [ours.maximal_device] == list(xla.tile_assignment_devices())
    else:
        dims, devices = _xla_tiles(xla)
        assert list(ours.tile_shape) + ([ours.replicas] if ours.replicas > 1 else []) == dims
        assert list(ours.devices) == devices
        assert (ours.replicas > 1) == xla.replicate_on_last_tile_dim() or \
            list(xla.subgroup_types()) == [xc.OpSharding_Type.REPLICATED]
    # printing then re-parsing with XLA gives the same tiling, in both forms
    for form in (None, False):
        again = xc.HloSharding.from_string(HloSharding.parse(text).to_string(iota=form))
        assert again == xla


def _iota_cases() -> list[tuple[list[int], list[int], list[int]]]:
    out = []
    for reshape in ([8], [2, 4], [4, 2], [2, 2, 2], [2, 1, 4], [3, 2, 2], [2, 3]):
        n = int(np.prod(reshape))
        for perm in itertools.permutations(range(len(reshape))):
            for tiles in ([n], [2, n // 2] if n % 2 == 0 else [n, 1]):
                out.append((tiles, list(reshape), list(perm)))
    return out


@pytest.mark.parametrize("tiles,reshape,perm", _iota_cases())
def test_iota_canonical_form_matches_xla(tiles: list[int], reshape: list[int], perm: list[int]) -> None:
    xla = xc.HloSharding.iota_tile(tiles, reshape, perm)
    devices = xla.tile_assignment_devices()
    assert str(HloSharding(tuple(tiles), tuple(devices))) == str(xla)


def test_iota_form_rejects_non_iota() -> None:
    assert iota_form([0, 2, 1, 3]) == ((2, 2), (1, 0))
    for devices in ([1, 0, 2, 3], [0, 1, 3, 2], [0, 3, 1, 2], [4, 5, 6, 7], [0, 2, 4, 1, 3, 5, 6, 7]):
        brute = [
            (r, p) for r in ([len(devices)], [2, len(devices) // 2], [len(devices) // 2, 2], [2, 2, 2])
            if int(np.prod(r)) == len(devices)
            for p in itertools.permutations(range(len(r)))
            if np.arange(len(devices)).reshape(r).transpose(p).ravel().tolist() == devices
        ]
        assert iota_form(devices) is None and not brute


@pytest.mark.parametrize("text", [
    "{devices=[2,4]5,1,7,3,0,2,4,6}", "{devices=[4,2]<=[2,2,2]T(1,0,2)}",
    "{devices=[2,1,4]<=[2,4]T(1,0) last_tile_dim_replicate}"])
def test_indices_of_strings_match_xla_tiling(text: str) -> None:
    """Device d holds tile ``argwhere(tile_assignment == d)``: read off XLA's own array."""
    xla = xc.HloSharding.from_string(text)
    dims, devices = _xla_tiles(xla)
    arr = np.asarray(devices).reshape(dims)
    tiles = dims[:-1] if xla.replicate_on_last_tile_dim() else dims
    shape = tuple(3 * t for t in tiles)
    got = shard_indices(text, shape)
    for d in devices:
        coord = np.argwhere(arr == d)[0][: len(tiles)]
        assert got[d] == tuple(slice(3 * c, 3 * c + 3) for c in coord)


def test_from_hlo_without_mesh_uses_tile_assignment() -> None:
    spec = ShardingSpec.from_hlo("{devices=[2,1,4]5,1,7,3,0,2,4,6 last_tile_dim_replicate}")
    assert spec.mesh.mesh_shape == (2, 4) and spec.mesh.device_ids == (5, 1, 7, 3, 0, 2, 4, 6)
    assert spec.dim_axes == ((0,), ())
    assert str(spec.to_hlo()) == "{devices=[2,1,4]5,1,7,3,0,2,4,6 last_tile_dim_replicate}"


def test_from_hlo_replicated_and_maximal() -> None:
    m = Mesh(range(8), (2, 4), ("x", "y"))
    assert ShardingSpec.from_hlo("{replicated}", m, ndim=3) == ShardingSpec.replicated(m, 3)
    with pytest.raises(RankError, match="pass ndim="):
        ShardingSpec.from_hlo("{replicated}", m)
    with pytest.raises(NotExpressibleError, match=r"maximal device=3.*one device"):
        ShardingSpec.from_hlo("{maximal device=3}", m)
    assert shard_indices("{maximal device=3}", (4, 2)) == {3: (slice(0, 4), slice(0, 2))}


@pytest.mark.parametrize("text,why", [
    ("{devices=[2,4]0,2,1,3,4,6,5,7}", "across tensor dims|devices differ"),
    ("{devices=[2,1,4]<=[2,4]T(1,0) last_tile_dim_replicate}", "devices differ|across"),
])
def test_from_hlo_not_on_mesh(text: str, why: str) -> None:
    m = Mesh(range(8), (2, 4), ("x", "y"))
    with pytest.raises(NotExpressibleError, match=why) as err:
        ShardingSpec.from_hlo(text, m)
    assert "not expressible on Mesh(x=2, y=4" in str(err.value)


def test_from_hlo_on_a_permuted_mesh() -> None:
    m = Mesh([3, 1, 2, 0, 7, 5, 6, 4], (2, 4), ("x", "y"))
    spec = ShardingSpec.from_hlo("{devices=[4,2]3,7,1,5,2,6,0,4}", m)
    assert spec.to_partition_spec() == ("y", "x")


@pytest.mark.parametrize("text,fragment", [
    ("devices=[2,4]<=[8]", "wrapped in braces"),
    ("{devices=[2,4]<=[4]}", "need 8 devices, got 4"),
    ("{devices=[2,4]0,1,2,3}", "need 8 devices, got 4"),
    ("{devices=[2,2]0,1,1,2}", "distinct"),
    ("{devices=[2,4]<=[2,4]T(0,0)}", "not a permutation"),
    ("{devices=[0,4]<=[8]}", ">= 1"),
    ("{devices=[8]<=[8] last_tile_dim_replicate}", "replica dim"),
    ("{devices=[2,4]<=[8] bogus_flag}", "unknown flag 'bogus_flag'"),
    ("{maximal device=x}", "could not read"),
    ("{manual}", "no device layout"),
    ("{{replicated}, {maximal device=0}}", "tuple shardings"),
    ("{devices=[2,1,2,2]<=[8] last_tile_dims={manual}}", "manual/unreduced"),
    ("{devices=[2,4]0 1 2 3 4 5 6 7}", "could not read"),
])
def test_malformed_strings(text: str, fragment: str) -> None:
    with pytest.raises(HloParseError) as err:
        HloSharding.parse(text)
    msg = str(err.value)
    assert fragment in msg and repr(text) in msg and "Allowed forms" in msg
    assert isinstance(err.value, ValueError)
