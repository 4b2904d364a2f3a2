"""``device_mesh["tp"]``, ``["dp", "tp"]``, ``_flatten`` and ``_unflatten`` on 'xla' meshes without
process groups: the devices each sub-mesh holds and where a ``Shard`` on it puts the data are
derived by hand from the device grid."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.distributed.device_mesh as tdm
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import xla_dtensor
import xla_dtensor.spmd as xs


@pytest.fixture(scope="module", params=["torch", "xla_dtensor"])
def dm24(request):
    init = tdm.init_device_mesh if request.param == "torch" else xla_dtensor.init_device_mesh
    return init("xla", (2, 4), mesh_dim_names=("dp", "tp"))


def _owner_rows(d: xs.XLAShardedTensor) -> dict[int, tuple[int, int]]:
    return {s.device_id: (s.indices[0].start, s.indices[0].stop) for s in d.local_shards}


def test_slicing_a_2d_mesh(dm24):
    tp, dp = dm24["tp"], dm24["dp"]
    assert tp.mesh.tolist() == [0, 1, 2, 3] and dp.mesh.tolist() == [0, 4]
    assert dm24["dp", "tp"] is dm24 and xs.submesh(dm24, "tp") == tp
    assert xs.as_mesh(tp).root_axes == (1,) and xs.as_mesh(dp).root_axes == (0,)
    # Shard(0) on "tp": rows split over the 4 devices of each row group, replicated over "dp"
    d = distribute_tensor(torch.arange(8.).reshape(8, 1), tp, [Shard(0)])
    assert d.placements == (Shard(0),)
    want = {dev: (2 * (dev % 4), 2 * (dev % 4) + 2) for dev in range(8)}
    assert _owner_rows(d) == want
    e = distribute_tensor(torch.arange(8.).reshape(8, 1), dp, [Shard(0)])
    assert _owner_rows(e) == {dev: (4 * (dev // 4), 4 * (dev // 4) + 4) for dev in range(8)}


def test_get_group_says_why_there_is_none(dm24):
    with pytest.raises(RuntimeError, match="no process groups"):
        dm24["tp"].get_group()


def test_3d_slices_and_flatten():
    dm = tdm.init_device_mesh("xla", (2, 2, 2), mesh_dim_names=("dp", "cp", "tp"))
    sub = dm["dp", "tp"]
    assert sub.mesh.tolist() == [[0, 1], [4, 5]] and xs.as_mesh(sub).root_axes == (0, 2)
    flat = dm["dp", "cp"]._flatten()
    assert flat.mesh_dim_names == ("dp_cp",) and flat.mesh.tolist() == [0, 2, 4, 6]
    assert xs.as_mesh(flat).root_axis_groups == ((0, 1),)
    # Shard(0) on the flattened axis: dp major, cp minor; tp holds replicas
    d = distribute_tensor(torch.arange(8.).reshape(8, 1), flat, [Shard(0)])
    grid = np.arange(8).reshape(2, 2, 2)
    want = {int(grid[a, b, c]): (2 * (2 * a + b), 2 * (2 * a + b) + 2)
            for a in range(2) for b in range(2) for c in range(2)}
    assert _owner_rows(d) == want
    assert xs.get_spec(d).on_root().to_partition_spec() == (("dp", "cp"), None)
    torch.testing.assert_close(d.full_tensor().cpu(), torch.arange(8.).reshape(8, 1))


def test_unflattened_meshes_as_torchtitan_builds_them():
    world = tdm.init_device_mesh("xla", (8,), mesh_dim_names=("world",))
    dense = world._unflatten(0, (2, 4), ("dp", "fsdp_tp"))
    assert dense.mesh.tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    tp = dense["fsdp_tp"]
    assert tp.mesh.tolist() == [0, 1, 2, 3]
    d = distribute_tensor(torch.arange(8.).reshape(8, 1), tp, [Shard(0)])
    assert _owner_rows(d) == {dev: (2 * (dev % 4), 2 * (dev % 4) + 2) for dev in range(8)}
    x = distribute_tensor(torch.arange(8.).reshape(8, 1), dense, [Shard(0), Replicate()])
    assert _owner_rows(x) == {dev: (4 * (dev // 4), 4 * (dev // 4) + 4) for dev in range(8)}
    dp = dense["dp"]   # devices 0 and 4: a stride-4 cut of the world axis
    assert dp.mesh.tolist() == [0, 4] and xs.as_mesh(dp).root.device_ids == tuple(range(8))
    y = distribute_tensor(torch.arange(8.).reshape(8, 1), dp, [Shard(0)])
    assert _owner_rows(y) == _owner_rows(x)
    w = distribute_tensor(torch.arange(8.).reshape(8, 1), world, [Shard(0)])
    # one program over layouts on four meshes of the same devices in the same order
    torch.testing.assert_close((d + x + y + w).cpu(), 4 * torch.arange(8.).reshape(8, 1))
