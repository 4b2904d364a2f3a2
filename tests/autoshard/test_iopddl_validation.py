"""IOPDDL reader: every bad value is an IopddlFormatError naming it; the decompressed size is capped."""
from __future__ import annotations

import copy
import gzip
import json
import math
import tracemalloc

import numpy as np
import pytest

from autoshard.solver.iopddl import MAX_BYTES, IopddlFormatError, read_iopddl

DOC = {"problem": {"name": "z", "nodes": {"intervals": [[0, 2], [1, 3]], "costs": [[1, 2], [2, 3]],
                                          "usages": [[1, 2], [3, 4]]},
                   "edges": {"nodes": [[0, 1]], "costs": [[0, 5, 6, 7]]}, "usage_limit": 10}}


def _write(tmp_path, doc, name="p.json") -> object:
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def _set(where: str, value):
    """A copy of DOC with the entry at dotted path ``where`` replaced."""
    doc = copy.deepcopy(DOC)
    *parents, last = where.split(".")
    node = doc["problem"]
    for key in parents:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(last) if last.isdigit() else last] = value
    return doc


@pytest.mark.parametrize("where, value, match", [
    ("nodes.costs.0.1", -1e30, r"nodes.costs\[0\]\[1\] = -1e\+30"),
    ("nodes.costs.1.0", float("nan"), r"nodes.costs\[1\]\[0\] = nan"),
    ("nodes.costs.1.0", float("-inf"), r"nodes.costs\[1\]\[0\] = -inf"),
    ("nodes.costs.0", ["a", 1], r"nodes.costs\[0\] must be a list of numbers"),
    ("nodes.costs.0", [], r"nodes.costs\[0\] must be a non-empty list"),
    ("nodes.usages.1.1", -4, r"nodes.usages\[1\]\[1\] = -4"),
    ("nodes.usages.0.0", float("inf"), r"nodes.usages\[0\]\[0\] = inf"),
    ("nodes.intervals.1", [3, 1], r"nodes.intervals\[1\] = \[3, 1\]; need 0 <= start <= end"),
    ("nodes.intervals.0", [-1, 2], r"nodes.intervals\[0\] = \[-1, 2\]"),
    ("nodes.intervals.0", [0.5, 2], r"nodes.intervals\[0\] must be a pair of integers"),
    ("nodes.intervals.0", [0, 1, 2], r"nodes.intervals\[0\] must be a pair of integers"),
    ("edges.nodes.0", [0.5, 1], r"edges.nodes\[0\] must be a pair of integers"),
    ("edges.nodes.0", [True, 1], r"edges.nodes\[0\] must be a pair of integers"),
    ("edges.nodes.0", [0, 2], r"edges.nodes\[0\] = \[0, 2\]: endpoint out of range 0..1"),
    ("edges.nodes.0", [-1, 1], r"endpoint out of range"),
    ("edges.costs.0", [0, 5, -6, 7], r"edges.costs\[0\]\[2\] = -6"),
    ("usage_limit", -1, r"usage_limit = -1"),
    ("usage_limit", "10", r"usage_limit = '10'"),
    ("nodes.intervals", "0-2", r"must be a list of \[a, b\] pairs"),
])
def test_bad_values_are_named(tmp_path, where, value, match):
    with pytest.raises(IopddlFormatError, match=match):
        read_iopddl(_write(tmp_path, _set(where, value)))


def test_forbidden_costs_become_inf_and_raw_inf_needs_inf_cost(tmp_path):
    path = _write(tmp_path, _set("nodes.costs.0.1", float("inf")))  # JSON 'Infinity'
    assert read_iopddl(path).node_costs[0].tolist() == [1.0, math.inf]
    with pytest.raises(IopddlFormatError, match=r"nodes.costs\[0\]\[1\] = inf; allowed: finite numbers >= 0"):
        read_iopddl(path, inf_cost=None)
    p = read_iopddl(_write(tmp_path, _set("nodes.costs.0.1", 2e18), "q.json"))
    assert p.node_costs[0][1] == math.inf
    np.testing.assert_array_equal(p.edge_costs[0], [[0, 5], [6, 7]])


def test_not_json_and_not_gzip(tmp_path):
    (tmp_path / "a.json").write_text("{nope")
    with pytest.raises(IopddlFormatError, match="not valid JSON"):
        read_iopddl(tmp_path / "a.json")
    (tmp_path / "b.json.gz").write_bytes(b"plain bytes")
    with pytest.raises(IopddlFormatError, match="cannot read"):
        read_iopddl(tmp_path / "b.json.gz")


def test_decompressed_size_is_capped_without_reading_it_all(tmp_path):
    """A small gzip that expands far past the cap fails after reading about the cap, not the whole."""
    path = tmp_path / "bomb.json.gz"
    chunk = b" " * (1 << 20)
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(b'{"problem": ')
        for _ in range(64):  # 64 MiB of whitespace in ~70 KiB of gzip
            f.write(chunk)
        f.write(json.dumps(DOC["problem"]).encode() + b"}")
    assert path.stat().st_size < 1 << 20
    cap = 4 << 20
    tracemalloc.start()
    try:
        with pytest.raises(IopddlFormatError, match=r"larger than the limit of 4,194,304 bytes"):
            read_iopddl(path, max_bytes=cap)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 3 * cap, peak  # ~the cap plus one chunk, not 64 MiB
    assert read_iopddl(path, max_bytes=128 << 20).num_nodes == 2  # a larger cap reads it
    assert MAX_BYTES == 1 << 30
