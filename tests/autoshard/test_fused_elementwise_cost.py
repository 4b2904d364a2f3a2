"""Elementwise ops are charged as fused (flops only), not as an unfused pass over memory."""
from __future__ import annotations

from autoshard.build import build_model
from autoshard.graph import Graph, TensorMeta
from mesh import Mesh, topology_for


def test_elementwise_costs_flops_only_and_matmul_keeps_its_roofline():
    topo = topology_for(Mesh(range(2), (2,), ("d",)), "cpu")
    g = Graph()
    x = g.add("placeholder", (), (TensorMeta((256, 256)),), role="input", name="x")
    w = g.add("placeholder", (), (TensorMeta((256, 256)),), role="param", name="w")
    a = g.add("aten.add.Tensor", ((x, 0), (x, 0)), (TensorMeta((256, 256)),))
    y = g.add("aten.mm.default", ((a, 0), (w, 0)), (TensorMeta((256, 256)),))
    m = build_model(g, topo)
    n = 256 * 256
    # oracle: the roofline by hand, from the preset's own figures (flops / peak; no memory term)
    replicated = m.strategies[a].index(next(s for s in m.strategies[a] if s.name.startswith("R")))
    got = m.problem.node_costs[a][replicated]
    assert abs(got - topo.compute_time(2.0 * n, 0.0)) < 1e-12
    assert got < topo.compute_time(0.0, 3 * 4 * n)  # the unfused memory pass would cost more here
    mm_r = m.problem.node_costs[y][0]
    assert mm_r >= topo.compute_time(0.0, 3 * 4 * n) - 1e-12  # matmul still pays its bytes (roofline)
