"""A checkpoint written by 2 processes (4 devices each, no torch process group): it loads in the same
2 processes on another layout, in one 8-device process, and in plain torch CPU (``dcp.load``), all
exact; a process that never saves and a missing process's data file are CheckpointErrors naming them."""
from __future__ import annotations

import json
import os
import shutil
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
from mesh import Mesh
from tests.reliability import _jobs
from tests.reliability.conftest import FOUR_DEVICES, free_port, results
from xla_dtensor import checkpoint


def _pair(phase, path, tmp_path, timeout=60.0):
    port = free_port()
    return [{"fn": "mp_checkpoint", "args": {"me": me, "port": port, "path": str(path), "phase": phase,
                                             "timeout": timeout},
             "out": str(tmp_path / f"{phase}{me}"), "env": FOUR_DEVICES} for me in (0, 1)]


def _ok(res, jobs):
    assert all(r["rc"] == 0 and not r["timed_out"] for r in res), (res, [open(j["out"]).read()[-3000:] for j in jobs])


@pytest.fixture(scope="module")
def two_process_checkpoint(zygote, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mp")
    jobs = _pair("save", tmp / "c", tmp)
    _ok(zygote.run(jobs, timeout=120), jobs)
    return tmp / "c"


def test_two_processes_write_one_checkpoint_that_loads_everywhere(zygote, two_process_checkpoint, tmp_path):
    path, vals = two_process_checkpoint, _jobs.mp_values()
    man = json.loads((path / ".xdt_manifest.json").read_text())
    assert man["processes"] == 2 and sorted(f for f in man["files"] if f.endswith(".distcp")) == ["__0_0.distcp",
                                                                                                   "__1_0.distcp"]
    jobs = _pair("load", path, tmp_path)                    # the same 2 processes, another layout
    _ok(zygote.run(jobs, timeout=120), jobs)
    for j in jobs:
        assert results(j["out"])[-1].startswith("loaded bad=[] step=5"), results(j["out"])
    mesh = Mesh(range(8), (2, 4), ("a", "b"))               # one process, 8 devices
    tgt = {k: xla_dtensor.distribute_tensor(torch.zeros_like(v), mesh, [Shard(0), Replicate()]) for k, v in vals.items()}
    tgt["meta"] = {"step": 0}
    checkpoint.load(tgt, path)
    plain = {k: torch.zeros_like(v) for k, v in vals.items()}  # plain torch CPU
    plain["meta"] = {"step": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.load(plain, checkpoint_id=str(path))
    for k, v in vals.items():
        assert torch.equal(tgt[k].cpu(), v) and torch.equal(plain[k], v), k
    assert tgt["meta"] == plain["meta"] == {"step": 5}


def test_a_missing_process_file_is_an_error_naming_it(two_process_checkpoint, tmp_path):
    path = tmp_path / "c"
    shutil.copytree(two_process_checkpoint, path)
    os.unlink(path / "__1_0.distcp")
    with pytest.raises(checkpoint.CheckpointError, match=r"__1_0\.distcp: missing"):
        checkpoint.load({k: torch.zeros_like(v) for k, v in _jobs.mp_values().items()}, path)


def test_a_process_that_never_saves_is_an_error_naming_it(zygote, tmp_path):
    jobs = _pair("save-without-1", tmp_path / "c", tmp_path, timeout=5.0)
    res = zygote.run(jobs, timeout=120)
    got = results(jobs[0]["out"])
    assert res[0]["rc"] == 5, (res, open(jobs[0]["out"]).read()[-3000:])
    assert "process 1 did not report its part of the checkpoint within 5 s" in got[-1], got
    assert not (tmp_path / "c").exists()                     # nothing published
