"""Topology: alpha-beta collective costs checked against the formulas worked by hand."""
from __future__ import annotations

import math

import mesh as m
import pytest

LINK_A = m.Link("ici", alpha=1e-6, beta=1e-11)   # 100 GB/s
LINK_B = m.Link("dcn", alpha=2e-5, beta=1e-9)    # 1 GB/s
DEV = m.DeviceSpec("toy", peak_flops=1e12, memory_bandwidth=1e11, memory_bytes=1e9)
TOPO = m.Topology(("dp", "tp"), (2, 4), (LINK_B, LINK_A), DEV)
MB = 1_000_000


def test_single_axis_formulas():
    assert TOPO.all_gather(MB, "tp") == pytest.approx(1e-6 + 1e-11 * 3 / 4 * MB)
    assert TOPO.reduce_scatter(MB, "tp") == pytest.approx(1e-6 + 1e-11 * 3 / 4 * MB)
    assert TOPO.all_reduce(MB, "tp") == pytest.approx(1e-6 + 2 * 1e-11 * 3 / 4 * MB)
    assert TOPO.all_to_all(MB, "tp") == pytest.approx(1e-6 + 1e-11 * 3 / 16 * MB * 2)
    assert TOPO.collective("all_reduce", MB, 0) == pytest.approx(2e-5 + 2 * 1e-9 * 1 / 2 * MB)


def test_several_axes_take_the_slowest_link_and_all_devices():
    assert TOPO.all_reduce(MB, ("dp", "tp")) == pytest.approx(2e-5 + 2 * 1e-9 * 7 / 8 * MB)


def test_trivial_groups_cost_nothing():
    one = m.Topology(("a", "b"), (1, 8), (LINK_A, LINK_A), DEV)
    assert one.all_reduce(MB, "a") == 0.0 and one.all_gather(MB, ()) == 0.0
    assert one.all_reduce(MB, ("a", "b")) == one.all_reduce(MB, "b")


def test_roofline_takes_the_binding_limit():
    assert TOPO.compute_time(2e12, 1e9) == pytest.approx(2.0)      # compute bound
    assert TOPO.compute_time(1e9, 1e12) == pytest.approx(10.0)     # memory bound


@pytest.mark.parametrize("preset", sorted(m.PRESETS))
def test_presets_are_physical(preset):
    topo = m.topology_for(m.Mesh(range(8), (2, 4), ("dp", "tp")), preset)
    assert topo.name == preset and topo.num_devices == 8
    d = topo.device
    assert d.peak_flops > 1e9 and d.memory_bandwidth > 1e9 and d.memory_bytes > 1e9
    # a bigger message never costs less; alpha is the floor
    assert topo.all_gather(10 * MB, "tp") > topo.all_gather(MB, "tp") > topo.links[1].alpha
    assert math.isclose(topo.reduce_scatter(MB, "tp"), topo.all_gather(MB, "tp"))


def test_errors_name_the_bad_value():
    with pytest.raises(m.AxisError, match=r"unknown mesh axis 'pp'.*\['dp', 'tp'\]"):
        TOPO.all_reduce(MB, "pp")
    with pytest.raises(m.AxisError, match="twice"):
        TOPO.all_reduce(MB, ("tp", 1))
    with pytest.raises(m.TopologyError, match=r"unknown collective 'broadcast'"):
        TOPO.collective("broadcast", MB, "tp")  # type: ignore[arg-type]
    with pytest.raises(m.TopologyError, match=r"unknown topology preset 'tpu-v9'.*allowed"):
        m.topology_for(m.Mesh(range(8), (8,)), "tpu-v9")
    with pytest.raises(m.TopologyError, match="one name and one link per axis"):
        m.Topology(("a",), (2, 2), (LINK_A,), DEV)
