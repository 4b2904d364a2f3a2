"""Disk plan cache: a fresh process reuses a plan without solving; bad files and directories degrade to solving."""
from __future__ import annotations

import mesh  # noqa: F401

import json
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

from autoshard import api
from autoshard.cache import ENV_VAR, PlanCache, PlanCacheWarning, default_dir
from autoshard.plan import Plan

ROOT = Path(__file__).resolve().parents[2]

GRAPH_SRC = textwrap.dedent("""
    from mesh import Mesh
    from autoshard.graph import Graph, TensorMeta
    def make():
        g = Graph(name="mlp")
        x = g.add("placeholder", (), (TensorMeta((64, 8)),), role="input", name="x")
        w1 = g.add("placeholder", (), (TensorMeta((8, 256)),), role="param", name="w1")
        w2 = g.add("placeholder", (), (TensorMeta((256, 8)),), role="param", name="w2")
        h = g.add("aten.mm.default", ((x, 0), (w1, 0)), (TensorMeta((64, 256)),))
        a = g.add("aten.gelu.default", ((h, 0),), (TensorMeta((64, 256)),))
        y = g.add("aten.mm.default", ((a, 0), (w2, 0)), (TensorMeta((64, 8)),))
        s = g.add("aten.sum.default", ((y, 0),), (TensorMeta(()),))
        g.outputs = [(s, 0)]
        return g, Mesh(range(4), (2, 2), ("data", "model"))
""")
_ns: dict = {}
exec(GRAPH_SRC, _ns)  # noqa: S102  (the same graph in this process and in the subprocess)
make = _ns["make"]


def _solve(cache_dir):
    g, m = make()
    return api.solve(g, m, "tpu-v5e", time_limit=20, cache_dir=cache_dir)


def test_fresh_process_hits_disk_cache_without_solving(tmp_path):
    api.clear_cache()
    plan = _solve(tmp_path)
    files = list(tmp_path.glob("*.json"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    script = GRAPH_SRC + textwrap.dedent(f"""
        import sys
        from autoshard import api
        def boom(*a, **k):
            raise AssertionError("solver called despite a cached plan")
        api.solve_problem = boom
        g, m = make()
        plan = api.solve(g, m, "tpu-v5e", time_limit=20, cache_dir={str(tmp_path)!r})
        sys.stdout.write(plan.to_json())
    """)
    out = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert Plan.from_json(out.stdout) == plan
    # the control: without the cache the patched solver is reached
    nocache = script.replace(f"cache_dir={str(tmp_path)!r}", "cache_dir=False")
    out = subprocess.run([sys.executable, "-c", nocache], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode != 0 and "solver called despite a cached plan" in out.stderr


def test_corrupted_file_warns_and_solves_again(tmp_path):
    api.clear_cache()
    plan = _solve(tmp_path)
    (f,) = tmp_path.glob("*.json")
    f.write_text('{"mesh_axes": ["data", "mo')
    api.clear_cache()
    with pytest.warns(PlanCacheWarning, match="corrupted"):
        again = _solve(tmp_path)
    assert again.placements == plan.placements
    assert Plan.from_json(f.read_text()) == again  # rewritten whole
    f.write_text(json.dumps({"mesh_axes": ["x"]}))  # valid JSON, not a plan
    api.clear_cache()
    with pytest.warns(PlanCacheWarning, match="corrupted"):
        _solve(tmp_path)


def test_unusable_directory_warns_and_runs_uncached(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    api.clear_cache()
    with pytest.warns(PlanCacheWarning, match="cannot use plan cache directory"):
        plan = _solve(blocker / "plans")
    assert plan.placements and blocker.read_text() == "not a directory"


def test_failed_write_warns_and_disables(tmp_path):
    cache = PlanCache(tmp_path / "c")
    (tmp_path / "c").rmdir()  # the directory vanished (or became read-only) after it was opened
    with pytest.warns(PlanCacheWarning, match="cannot write"):
        cache.put("k", Plan(mesh_axes=("d",), mesh_shape=(2,), topology="cpu"))
    assert not cache.usable and cache.get("k") is None


def test_memory_only_and_bad_argument(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV_VAR, str(tmp_path))
    assert default_dir() == tmp_path / "plans"
    api.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanCacheWarning)
        _solve(False)
    assert not (tmp_path / "plans").exists()
    api.clear_cache()
    _solve(None)
    assert len(list((tmp_path / "plans").glob("*.json"))) == 1
    api.clear_cache()
    with pytest.raises(TypeError, match="cache_dir must be a path.*got 3"):
        _solve(3)


def _tamper(f: Path, change) -> None:
    d = json.loads(f.read_text())
    change(d)
    f.write_text(json.dumps(d))


BAD_ENTRIES = {
    "split dim 99": lambda d: d["placements"].__setitem__("w1", [["S", 99], "R"]),
    "placements emptied": lambda d: d.__setitem__("placements", {}),
    "a [3,3] mesh": lambda d: d.__setitem__("mesh_shape", [3, 3]),
    "a 5-entry spec": lambda d: d["placements"].__setitem__("w1", ["R"] * 5),
    "an unknown placement": lambda d: d["placements"].__setitem__("w1", ["Q", "R"]),
    "an activation split past its rank": lambda d: d["activations"].__setitem__(
        next(iter(d["activations"])), [["S", 7], "R"]),
    "a shape of another graph": lambda d: d["shapes"].__setitem__("x", [65, 8]),
}


@pytest.mark.parametrize("case", sorted(BAD_ENTRIES))
def test_a_cached_plan_that_does_not_fit_the_graph_warns_and_is_solved_again(tmp_path, case):
    api.clear_cache()
    plan = _solve(tmp_path)
    (f,) = tmp_path.glob("*.json")
    _tamper(f, BAD_ENTRIES[case])
    api.clear_cache()
    solves = api.STATS["solves"]
    with pytest.warns(PlanCacheWarning, match="does not fit this graph and mesh"):
        again = _solve(tmp_path)
    assert api.STATS["solves"] == solves + 1
    assert again.placements == plan.placements and again.mesh_shape == (2, 2)
    assert Plan.from_json(f.read_text()) == again  # the bad entry was replaced
    api.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PlanCacheWarning)
        assert _solve(tmp_path) == again and api.STATS["solves"] == solves + 1  # now a clean hit
