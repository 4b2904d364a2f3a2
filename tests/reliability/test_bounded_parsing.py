"""Sharding strings that name huge device counts: a clear error within 1 s and 100 MB, never an allocation
of their size (issue 41, item 5). Both the parser and ``xla-dtensor-visualize`` run in a child
interpreter whose address space is capped, so an allocation of the string's size fails the test.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HUGE = [
    "{devices=[1]<=[400000000]}",
    "{devices=[400000000]<=[400000000]}",
    "{devices=[20000,20000]<=[400000000]}",
    "{devices=[2,2]<=[20000,20000]T(1,0) last_tile_dim_replicate}",
    "{devices=[1]<=[" + ",".join(["1"] * 100) + "]}",
    "{devices=[1]" + "9" * 5000 + "}",
    "{maximal device=" + "9" * 5000 + "}",
]
CHILD = textwrap.dedent("""
    import json, resource, sys, time
    from xla_dtensor.sharding.errors import HloParseError
    from xla_dtensor.sharding.hlo import HloSharding
    from xla_dtensor.sharding.hlo_mesh import spec_from_hlo
    from xla_dtensor import visualize
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = []
    for text in json.loads(sys.argv[1]):
        for how in ("parse", "spec", "cli"):
            t = time.perf_counter()
            try:
                if how == "parse":
                    HloSharding.parse(text)
                elif how == "spec":
                    spec_from_hlo(text)
                else:
                    visualize.main([text, "--shape", "16,16", "--no-color"])
                got = "no error"
            except HloParseError as err:
                got = "HloParseError: " + str(err)
            except SystemExit as err:
                got = f"exit {err.code}"
            except BaseException as err:
                got = f"{type(err).__name__}: {err}"[:300]
            out.append([text[:40], how, got[:60] + " ... " + got[-400:], time.perf_counter() - t])
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
    print(json.dumps({"cases": out, "grown": grown}))
""")


def _run(args: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_huge_device_counts_are_a_clear_error_fast_and_small():
    res = _run(HUGE)
    for text, how, got, secs in res["cases"]:
        if how == "cli":
            assert got.startswith("exit 2"), (text, got)
        else:
            assert "malformed HLO sharding" in got, (text, how, got)
            assert "MAX_DEVICES" in got or "digits" in got or "entries" in got, got
        assert secs < 1.0, (text, how, secs)
    assert res["grown"] < 100 * 2**20, res["grown"]


def test_a_visualizer_mesh_of_too_many_devices_is_refused(capsys):
    from xla_dtensor import visualize
    with pytest.raises(SystemExit) as err:
        visualize.main(["('x', None)", "--shape", "16,16", "--mesh", "100000,100000"])
    assert err.value.code == 2
    assert "10000000000 devices" in capsys.readouterr().err


def test_sharding_strings_at_real_sizes_still_parse():
    from xla_dtensor.sharding.hlo import MAX_DEVICES, HloSharding
    h = HloSharding.parse("{devices=[64,128,2]<=[16384]  last_tile_dim_replicate}")
    assert h.tile_shape == (64, 128) and h.replicas == 2 and len(h.devices) == 16384
    assert len(HloSharding.parse(f"{{devices=[{MAX_DEVICES}]<=[{MAX_DEVICES}]}}").devices) == MAX_DEVICES
