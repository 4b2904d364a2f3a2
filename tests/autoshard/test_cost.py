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
