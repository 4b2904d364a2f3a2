"""Mesh: torch_xla semantics, JAX conversion, sub-meshes, torch bridge, bad input."""
from __future__ import annotations

from collections import OrderedDict

import mesh as m
import numpy as np
import pytest
import jax
from torch.distributed.device_mesh import DeviceMesh


def test_shape_and_logical_mesh_follow_torch_xla_docs():
    mesh = m.Mesh(np.array(range(8)), (4, 2), ("x", "y"))
    assert mesh.shape() == OrderedDict([("x", 4), ("y", 2)])
    assert mesh.size() == 8
    np.testing.assert_array_equal(mesh.get_logical_mesh(), np.arange(8).reshape(4, 2))
    assert mesh.get_axis_name_idx("y") == 1
    assert mesh.axis_index(-1) == 1 and mesh.axis_size("x") == 4


def test_unnamed_mesh_keys_axes_by_index():
    mesh = m.Mesh(range(8), (2, 2, 2))
    assert mesh.shape() == OrderedDict([(0, 2), (1, 2), (2, 2)])
    assert mesh.jax_axis_names == ("dim0", "dim1", "dim2")
    assert mesh.axis_index("dim2") == 2 and mesh.axis_name(1) == "dim1"


def test_jax_mesh_keeps_device_order_and_auto_axes():
    order = [7, 6, 5, 4, 3, 2, 1, 0]
    jm = m.Mesh(order, (2, 4), ("data", "model")).jax_mesh()
    assert [d.id for d in jm.devices.reshape(-1)] == order
    assert jm.axis_names == ("data", "model")
    assert all(t == jax.sharding.AxisType.Auto for t in jm.axis_types)


def test_equality_and_hash():
    a = m.Mesh(range(8), (2, 4), ("a", "b"))
    assert a == m.Mesh(list(range(8)), [2, 4], ["a", "b"]) and hash(a) == hash(m.Mesh(range(8), (2, 4), ("a", "b")))
    assert a != m.Mesh(range(8), (4, 2), ("a", "b"))
    assert a != m.Mesh(range(8), (2, 4), ("a", "c"))
    assert len({a, m.Mesh(range(8), (2, 4), ("a", "b"))}) == 1


def test_sub_mesh_slices_one_group_and_remembers_root():
    mesh = m.Mesh(range(8), (2, 4), ("dp", "tp"))
    tp, dp = mesh["tp"], mesh["dp"]
    assert tp.get_logical_mesh().tolist() == [0, 1, 2, 3] and tp.root is mesh and tp.root_axes == (1,)
    assert dp.get_logical_mesh().tolist() == [0, 4] and dp.root_axes == (0,)
    both = mesh[("tp", "dp")]
    np.testing.assert_array_equal(both.get_logical_mesh(), np.arange(8).reshape(2, 4).T)
    assert both.root_axes == (1, 0)


def test_global_mesh_round_trip():
    mesh = m.Mesh(range(8), (8,), ("data",))
    try:
        m.set_global_mesh(mesh)
        assert m.get_global_mesh() is mesh
    finally:
        m.set_global_mesh(None)
    assert m.get_global_mesh() is None
    with pytest.raises(TypeError, match="set_global_mesh expects"):
        m.set_global_mesh("data")


def test_from_torch_keeps_order_and_names():
    ids = [[3, 1, 2, 0], [7, 5, 6, 4]]
    mesh = m.from_torch(DeviceMesh("xla", ids, mesh_dim_names=("dp", "tp")))
    assert mesh.get_logical_mesh().tolist() == ids and mesh.axis_names == ("dp", "tp")
    with pytest.raises(TypeError, match="DeviceMesh"):
        m.from_torch(np.arange(4))


@pytest.mark.parametrize("args, exc, text", [
    ((range(8), (3, 2)), m.MeshShapeError, "holds 6 devices but 8"),
    ((range(8), (0, 8)), m.MeshShapeError, "sizes >= 1"),
    (([0, 1, 1, 2], (4,)), m.DeviceIdError, r"duplicated: \[1\]"),
    (([0, -1], (2,)), m.DeviceIdError, r"\[-1\]"),
    (([0.5, 1.0], (2,)), m.DeviceIdError, "integers"),
    ((range(4), (2, 2), ("a", "a")), m.AxisError, r"\['a'\] used more than once"),
    ((range(4), (2, 2), ("a",)), m.AxisError, "1 names for a 2-D mesh"),
    ((range(4), (4,), "a"), m.AxisError, "got the string"),
])
def test_bad_meshes_raise_specific_errors(args, exc, text):
    with pytest.raises(exc, match=text):
        m.Mesh(*args)
    assert issubclass(exc, ValueError)


def test_unknown_axis_and_device_errors_list_what_exists():
    mesh = m.Mesh(range(8), (2, 4), ("dp", "tp"))
    with pytest.raises(m.AxisError, match=r"unknown mesh axis 'pp'.*\['dp', 'tp'\]"):
        mesh.axis_index("pp")
    with pytest.raises(m.AxisError, match="out of range"):
        mesh.axis_index(2)
    with pytest.raises(m.AxisError, match="twice"):
        mesh[("tp", "tp")]
    with pytest.raises(m.MeshDevicesError, match=r"\[8, 9\] that JAX does not have"):
        m.Mesh(range(2, 10), (8,))
    unchecked = m.Mesh(range(2, 10), (8,), validate=False)   # fails where devices are needed
    with pytest.raises(m.MeshDevicesError, match=r"\[8, 9\] that JAX does not have"):
        unchecked.jax_mesh()


def test_mesh_checks_its_devices_at_construction():
    """Issue 24: a mesh naming devices JAX lacks fails where it is built, saying how to get more."""
    import jax

    n = len(jax.devices())
    with pytest.raises(m.MeshDevicesError) as info:
        m.Mesh(range(2 * n), (2, n), ("a", "b"))
    msg = str(info.value)
    assert f"names device ids {list(range(n, 2 * n))}" in msg or f"[{n}, {n + 1}, ..., {2 * n - 1}]" in msg
    assert f"JAX has {n} " in msg and f"XLA_DTENSOR_CPU_DEVICES={2 * n}" in msg and "validate=False" in msg
    assert issubclass(m.MeshDevicesError, m.DeviceIdError) and issubclass(m.MeshDevicesError, ValueError)
    from types import SimpleNamespace
    ids = [SimpleNamespace(id=i) for i in range(2 * n)]
    with pytest.raises(m.MeshDevicesError, match="HybridMesh"):
        m.HybridMesh(ici_mesh_shape=(1, n), dcn_mesh_shape=(2, 1), devices=ids, num_granules=2)


def test_validate_false_describes_another_machine_for_planning():
    from types import SimpleNamespace

    big = m.Mesh(range(256), (16, 16), ("data", "model"), validate=False)
    assert big["model"].size() == 16 and big["model"].get_logical_mesh().tolist() == list(range(16))
    assert m.topology_for(big, "tpu-v5e").all_reduce(1 << 20, "model") > 0
    ids = [SimpleNamespace(id=i) for i in range(32)]
    hm = m.HybridMesh(ici_mesh_shape=(1, 16), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"), devices=ids,
                      num_granules=2, validate=False)
    assert hm.axis_kinds() == OrderedDict([("dcn", "dcn"), ("ici", "ici")])
    topo = m.topology_for(hm, "tpu-v5e")   # DCN axis priced slower than ICI
    assert topo.all_reduce(1 << 24, "dcn") > topo.all_reduce(1 << 24, "ici")


def test_autoshard_plans_for_more_devices_than_this_machine(tmp_path):
    """The planner's other-topology path: 16 chips in 2 slices (DCN), on 8 virtual devices."""
    from autoshard.__main__ import main
    from autoshard.plan import Plan

    out = tmp_path / "plan.json"
    assert main(["plan", "--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "64", "--seq", "8",
                 "--batch", "16", "--mesh", "16", "--dcn", "2", "--time-limit", "20", "--quiet",
                 "--json", str(out)]) == 0
    assert Plan.from_json(out.read_text()).mesh_shape == (16,)
