"""HybridMesh: device order against jax's create_hybrid_device_mesh, axis kinds, docs example."""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import mesh as m
import numpy as np
import pytest
from jax.experimental import mesh_utils


@dataclass(frozen=True)
class FakeDevice:
    """Enough of a jax Device for mesh_utils: simulates slices on a host without them."""
    id: int
    slice_index: int
    process_index: int = 0
    platform: str = "cpu"
    device_kind: str = "cpu"


def _fake_devices(n: int, granules: int, shuffle: bool) -> list[FakeDevice]:
    per = n // granules
    devs = [FakeDevice(i, i // per) for i in range(n)]
    if shuffle:  # slices listed out of order must still be grouped and sorted
        devs = devs[per:] + devs[:per]
    return devs


@pytest.mark.parametrize("ici, dcn", [
    ((1, 4), (2, 1)), ((4, 1), (1, 2)), ((2, 2), (2, 1)), ((1, 4, 1), (2, 1, 1)),
    ((2, 1, 2), (1, 2, 1)), ((2, 2, 2), (1, 1, 1)), ((1, 2), (2, 2)), ((1, 1, 2), (2, 2, 1)),
])
@pytest.mark.parametrize("shuffle", [False, True])
def test_device_order_matches_jax_create_hybrid_device_mesh(ici, dcn, shuffle):
    devices = _fake_devices(8, int(np.prod(dcn)), shuffle)
    expected = np.vectorize(lambda d: d.id)(mesh_utils.create_hybrid_device_mesh(ici, dcn, devices))
    ours = m.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=dcn, devices=devices)
    np.testing.assert_array_equal(ours.get_logical_mesh(), expected)


def test_docs_example_on_eight_devices():
    hm = m.HybridMesh(ici_mesh_shape=(1, 4, 1), dcn_mesh_shape=(2, 1, 1),
                      axis_names=("data", "fsdp", "tensor"), num_granules=2)
    assert hm.shape() == OrderedDict([("data", 2), ("fsdp", 4), ("tensor", 1)])
    assert hm.get_logical_mesh().reshape(2, 4).tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert list(hm.axis_kinds().values()) == ["dcn", "ici", "trivial"]
    assert hm.granule_of(5) == 1 and hm.granules == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert [d.id for d in hm.jax_mesh().devices.reshape(-1)] == list(range(8))


def test_axis_spanning_both_networks():
    hm = m.HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(2, 1), num_granules=2)
    assert hm.axis_kind(0) == "ici+dcn" and hm.axis_kind(1) == "ici"
    # Axis 0 = dcn index * 2 + ici index: rows 0-1 in granule 0, rows 2-3 in granule 1.
    assert hm.get_logical_mesh().tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_process_index_is_the_granule_when_there_are_no_slices():
    devs = [FakeDevice(i, None, process_index=i // 4) for i in range(8)]  # type: ignore[arg-type]
    hm = m.HybridMesh(ici_mesh_shape=(4,), dcn_mesh_shape=(2,), devices=devs)
    expected = mesh_utils.create_hybrid_device_mesh((4,), (2,), devs, process_is_granule=True)
    assert hm.get_logical_mesh().tolist() == [d.id for d in expected]


def test_hybrid_mesh_topology_puts_dcn_links_on_cross_granule_axes():
    hm = m.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dp", "tp"), num_granules=2)
    topo = hm.topology("tpu-v5e")
    assert [link.kind for link in topo.links] == ["dcn", "ici"]
    assert topo.all_reduce(1 << 24, "dp") > 10 * topo.all_reduce(1 << 24, "tp")


@pytest.mark.parametrize("kwargs, text", [
    (dict(ici_mesh_shape=(4,), dcn_mesh_shape=(2, 1)), "same number of axes"),
    (dict(ici_mesh_shape=(4,), dcn_mesh_shape=(4,), num_granules=2), r"needs 4 granules but the devices form 2"),
    (dict(ici_mesh_shape=(4,), dcn_mesh_shape=(2,)), r"form 1 \(sizes \[8\]\); .* pass num_granules=2"),
    (dict(ici_mesh_shape=(2,), dcn_mesh_shape=(2,), num_granules=2), "needs 2 devices per granule"),
    (dict(ici_mesh_shape=(4,), dcn_mesh_shape=(2,), num_granules=3), "must be >= 1 and divide the 8"),
])
def test_bad_hybrid_meshes(kwargs, text):
    kwargs = dict(kwargs)
    with pytest.raises(m.MeshShapeError, match=text):
        m.HybridMesh(**kwargs)
