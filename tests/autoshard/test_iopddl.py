"""autoshard.solver.iopddl reader/CLI and autoshard.solver.evaluate against hand-computed numbers."""
from __future__ import annotations

import gzip
import json
import math

import numpy as np
import pytest

from _iopddl_data import iopddl_file
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.solver.iopddl import IopddlFormatError, main, read_iopddl
from autoshard.solver.problem import Problem


def test_reader_matches_json() -> None:
    path = iopddl_file("example.json")
    raw = json.loads(path.read_text())["problem"]
    p = read_iopddl(path)
    assert p.name == "example" and p.num_nodes == 5 and p.memory_limit == 50
    assert [c.tolist() for c in p.node_costs] == raw["nodes"]["costs"]
    assert [m.tolist() for m in p.node_memory] == raw["nodes"]["usages"]
    assert p.intervals == [tuple(i) for i in raw["nodes"]["intervals"]]
    assert p.edges == [tuple(e) for e in raw["edges"]["nodes"]]
    # edge (1, 3) is 2 x 2, row-major [90, 10, 20, 80]
    np.testing.assert_array_equal(p.edge_costs[2], [[90, 10], [20, 80]])
    assert p.edge_costs[1].shape == (1, 3) and p.edge_costs[3].shape == (3, 1)


def test_reader_gzip_and_contest_infinity(tmp_path) -> None:
    doc = {"problem": {"name": "z", "nodes": {"intervals": [[0, 2], [1, 3]],
                                              "costs": [[1, 1e18], [2, 3]], "usages": [[1, 2], [3, 4]]},
                       "edges": {"nodes": [[0, 1]], "costs": [[0, 5, 1e18, 7]]}}}
    path = tmp_path / "z.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(doc, f)
    p = read_iopddl(path)
    assert p.node_costs[0].tolist() == [1.0, math.inf] and p.memory_limit is None
    np.testing.assert_array_equal(p.edge_costs[0], [[0, 5], [math.inf, 7]])
    assert read_iopddl(path, inf_cost=None).node_costs[0][1] == 1e18


@pytest.mark.parametrize("patch, match", [
    (lambda d: d["nodes"].pop("usages"), "missing key 'usages'"),
    (lambda d: d["edges"]["costs"].__setitem__(0, [1, 2, 3]), r"edge 0 \(0, 1\): 3 costs, expected 2 x 2"),
    (lambda d: d["edges"]["nodes"].__setitem__(0, [0, 7]), "out of range"),
    (lambda d: d["nodes"]["usages"].__setitem__(1, [3]), "node 1: 2 costs but 1 usages"),
])
def test_reader_rejects_bad_files(tmp_path, patch, match) -> None:
    doc = {"problem": {"name": "z", "nodes": {"intervals": [[0, 2], [1, 3]], "costs": [[1, 2], [2, 3]],
                                              "usages": [[1, 2], [3, 4]]},
                       "edges": {"nodes": [[0, 1]], "costs": [[0, 5, 6, 7]]}}}
    patch(doc["problem"])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(IopddlFormatError, match=match):
        read_iopddl(path)


def test_evaluate_example_by_hand() -> None:
    p = read_iopddl(iopddl_file("example.json"))
    # strategies [0, 1, 2, 0, 0]: nodes 15 + 65 + 35 + 85 + 95 = 295;
    # edges (0,1)[0,1]=40, (0,2)[0,2]=40, (1,3)[1,0]=20, (2,4)[2,0]=30, (3,4)[0,0]=70 -> 200.
    # live sets: t in [50, 70) holds nodes 0, 1, 2: 10 + 25 + 15 = 50 <= 50.
    assert evaluate(p, [0, 1, 2, 0, 0]) == (495.0, True, 50.0)
    # strategies [0, 0, 1, 1, 0]: nodes 15 + 55 + 45 + 75 + 95 = 285; edges 30 + 10 + 10 + 20 + 60
    # = 130; node 2 under strategy 1 uses 20, so t in [50, 70) holds 10 + 25 + 20 = 55 > 50.
    assert evaluate(p, [0, 0, 1, 1, 0]) == (415.0, False, 55.0)


def test_evaluate_interval_end_is_exclusive_and_inf_is_infeasible() -> None:
    # node 0 live [0, 10), node 1 live [10, 20): never together, peak 7, limit 7 holds.
    p = Problem("t", [np.array([1.0, math.inf]), np.array([2.0])], [np.array([7.0, 1.0]), np.array([6.0])],
                [(0, 10), (10, 20)], [], [], 7.0)
    assert evaluate(p, [0, 0]) == (3.0, True, 7.0)
    cost, feasible, _ = evaluate(p, [1, 0])
    assert math.isinf(cost) and not feasible
    p.intervals = [(0, 11), (10, 20)]  # now both live at t = 10: 7 + 6 = 13 > 7
    assert evaluate(p, [0, 0]) == (3.0, False, 13.0)
    p.intervals = [(5, 5), (10, 20)]  # empty interval: never live
    assert evaluate(p, [0, 0])[2] == 6.0
    with pytest.raises(ValueError, match="node 0: strategy 2 out of range, allowed 0..1"):
        evaluate(p, [2, 0])


def test_instance_b_matches_published_size() -> None:
    p = read_iopddl(iopddl_file("asplos-2025-iopddl-B.json.gz"))
    # contest table: 816 nodes, 1,096 edges, 12.5 strategies on average
    assert p.num_nodes == 816 and len(p.edges) == 1096
    assert round(np.mean([len(c) for c in p.node_costs]), 1) == 12.5


def test_cli_prints_optimum(capsys) -> None:
    path = iopddl_file("example.json")
    best, _, _ = brute_force(read_iopddl(path))
    assert main([str(path), "--time-limit", "10", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "status:    OPTIMAL" in out and f"objective: {best:.10g}\n" in out
    assert "gap:       0.000%" in out
