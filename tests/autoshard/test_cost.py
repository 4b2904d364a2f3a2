"""Cost model: resharding costs worked out by hand from the alpha-beta formulas."""
from __future__ import annotations

import pytest

from autoshard.cost import combined_collectives, reshard_cost
from autoshard.graph import TensorMeta
from mesh import DeviceSpec, Link, Topology

DEV = DeviceSpec("toy", 1e12, 1e11, 1e9)
TOPO = Topology(("dp", "tp"), (2, 4), (Link("a", 1e-4, 1e-9), Link("b", 1e-5, 1e-10)), DEV)
T = TensorMeta((1024, 256), "float32")  # 1 MiB
B = 1024 * 256 * 4


def test_reshard_costs_follow_the_collective_formulas():
    assert reshard_cost(("R", "R"), ("R", "R"), T, TOPO) == 0.0
    assert reshard_cost(("R", "R"), (("S", 0), "R"), T, TOPO) == 0.0          # slicing is free
    assert reshard_cost((("S", 0), "R"), ("R", "R"), T, TOPO) == pytest.approx(1e-4 + 1e-9 * B / 2)
    assert reshard_cost(("P", "R"), ("R", "R"), T, TOPO) == pytest.approx(1e-4 + 2e-9 * B / 2)
    assert reshard_cost(("R", "P"), ("R", ("S", 1)), T, TOPO) == pytest.approx(1e-5 + 1e-10 * 3 / 4 * B)
    # the other axis's split shrinks the message: all-reduce over dp of a tp-sharded tensor
    assert reshard_cost(("P", ("S", 1)), ("R", ("S", 1)), T, TOPO) == pytest.approx(1e-4 + 2e-9 * B / 4 / 2)


def test_combined_collectives_drop_only_the_latency():
    fused = combined_collectives(TOPO)
    assert [link.beta for link in fused.links] == [link.beta for link in TOPO.links]
    assert reshard_cost(("P", "R"), ("R", "R"), T, fused) == pytest.approx(2e-9 * B / 2)
    assert reshard_cost(("P", "R"), ("R", "R"), T, TOPO) - reshard_cost(("P", "R"), ("R", "R"), T, fused) \
        == pytest.approx(1e-4)


SAME = Topology(("dp", "tp"), (2, 4), (Link("a", 1e-4, 1e-9), Link("a", 1e-4, 1e-9)), DEV)


def test_shard_to_partial_is_an_all_gather_and_replicate_to_partial_is_free():
    # XLA cannot turn a shard into a partial sum locally: it gathers the shard first
    assert reshard_cost(("R", ("S", 0)), ("R", "P"), T, TOPO) == pytest.approx(1e-5 + 1e-10 * 3 / 4 * B)
    assert reshard_cost(("R", ("S", 0)), ("R", "P"), T, TOPO) == reshard_cost(("R", ("S", 0)), ("R", "R"), T, TOPO)
    assert reshard_cost(("R", "R"), ("R", "P"), T, TOPO) == 0.0


def test_axes_on_the_same_link_doing_the_same_collective_are_one_collective():
    # all-reduce over the 8 devices of a 2x4 mesh: one latency, ring bytes 2 (n-1)/n B with n = 8
    assert reshard_cost(("P", "P"), ("R", "R"), T, SAME) == pytest.approx(1e-4 + 2e-9 * 7 / 8 * B)
    # all-gather of a tensor split over both axes (dim 0 on both): one gather, (n-1)/n B
    assert reshard_cost((("S", 0), ("S", 0)), ("R", "R"), T, SAME) == pytest.approx(1e-4 + 1e-9 * 7 / 8 * B)
    # different kinds stay separate collectives: all-reduce over dp of the tp-shard, all-gather over tp
    assert reshard_cost(("P", ("S", 1)), ("R", "R"), T, SAME) == pytest.approx(
        (1e-4 + 2e-9 * 1 / 2 * B / 4) + (1e-4 + 1e-9 * 3 / 4 * B))
    # different links stay separate collectives, each on its own link (the unchanged per-axis sum)
    assert reshard_cost(("P", "P"), ("R", "R"), T, TOPO) == pytest.approx(
        (1e-4 + 2e-9 * 1 / 2 * B) + (1e-5 + 2e-10 * 3 / 4 * B))
