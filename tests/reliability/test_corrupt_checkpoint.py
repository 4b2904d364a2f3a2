"""Delete, truncate or alter each kind of checkpoint file: every load is a CheckpointError naming that
file, or (a change that means nothing, e.g. JSON whitespace) exactly the saved values; never others.

Every failed load leaves its targets (CPU and device) as they were.
Kinds: the manifest (``.xdt_manifest.json``), torch's ``.metadata`` and the data file
(``__0_0.distcp``). Counts are printed (pytest -s) and asserted: 0 silent wrong results.
"""
from __future__ import annotations

import os
import random
import shutil

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
from mesh import Mesh
from xla_dtensor import checkpoint
from xla_dtensor.checkpoint import publish

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
KINDS = (".xdt_manifest.json", ".metadata", "__0_0.distcp")


def _values():
    g = torch.Generator().manual_seed(7)
    return {"w": torch.randn(16, 8, generator=g), "u": torch.randn(10, 3, generator=g), "meta": {"step": 11}}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    mesh = Mesh(range(8), (2, 4), ("a", "b"))
    v = _values()
    path = tmp_path_factory.mktemp("ckpt") / "c"
    checkpoint.save({"w": xla_dtensor.distribute_tensor(v["w"], mesh, [Shard(0), Shard(1)]),
                     "u": xla_dtensor.distribute_tensor(v["u"], mesh, [Shard(0), Replicate()]), "meta": v["meta"]}, path)
    return path


def _targets(on_device: bool) -> dict:
    """Targets holding -1 (a failed load must leave them so: issue 41, item 3)."""
    if not on_device:
        return {"w": torch.full((16, 8), -1.0), "u": torch.full((10, 3), -1.0), "meta": {"step": 0}}
    mesh = Mesh(range(8), (2, 4), ("a", "b"))
    return {"w": xla_dtensor.distribute_tensor(torch.full((16, 8), -1.0), mesh, [Replicate(), Shard(0)]),
            "u": xla_dtensor.distribute_tensor(torch.full((10, 3), -1.0), mesh, [Shard(0), Replicate()]),
            "meta": {"step": 0}}


def _outcome(path, kind: str, on_device: bool = False) -> str:
    v = _values()
    tgt = _targets(on_device)
    try:
        checkpoint.load(tgt, path)
    except checkpoint.CheckpointError as err:
        untouched = all(torch.equal(tgt[k].cpu(), torch.full(v[k].shape, -1.0)) for k in ("w", "u"))
        if not untouched or tgt["meta"] != {"step": 0}:
            return f"targets changed by a failed load: {err}"
        return "error" if kind in str(err) or kind == ".xdt_manifest.json" and "manifest" in str(err) else f"vague: {err}"
    same = torch.equal(tgt["w"].cpu(), v["w"]) and torch.equal(tgt["u"].cpu(), v["u"]) and tgt["meta"] == v["meta"]
    return "exact" if same else "wrong"


def test_each_file_kind_deleted_truncated_or_altered(saved, tmp_path):
    rng = random.Random(0)
    counts: dict[str, int] = {}
    trials = 0
    for kind in KINDS:
        size = (saved / kind).stat().st_size
        cases = [("delete", None)] + [("truncate", n) for n in (0, 1, size // 2, size - 1)]
        cases += [("alter", rng.randrange(size)) for _ in range(16)]
        for op, arg in cases:
            path = tmp_path / f"{kind}-{op}-{arg}"
            shutil.copytree(saved, path)
            f = path / kind
            if op == "delete":
                f.unlink()
            elif op == "truncate":
                os.truncate(f, arg)
            else:
                data = bytearray(f.read_bytes())
                data[arg] ^= 0x5A
                f.write_bytes(bytes(data))
            for on_device in (False, True):
                outcome = _outcome(path, kind, on_device)
                counts[outcome] = counts.get(outcome, 0) + 1
                trials += 1
                assert outcome in ("error", "exact"), (kind, op, arg, on_device, outcome)
    print(f"\ncorrupt checkpoint files: {trials} trials, {counts.get('error', 0)} clear errors naming the file, "
          f"{counts.get('exact', 0)} harmless changes loaded exactly, {counts.get('wrong', 0)} silent wrong results "
          f"(CPU and device targets; every failed load left its targets as they were)")


def test_a_save_killed_between_its_two_renames_leaves_an_error_naming_the_copies(saved, tmp_path, monkeypatch):
    path = tmp_path / "c"
    shutil.copytree(saved, path)
    monkeypatch.setattr(publish, "_exchange", lambda a, b: False)
    real, calls = os.rename, []

    def dies_after_first(a, b):
        calls.append((a, b))
        if len(calls) == 2:
            raise KeyboardInterrupt("killed")  # the process dies here: old aside, new not yet in place
        real(a, b)

    monkeypatch.setattr(os, "rename", dies_after_first)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save({"w": torch.ones(16, 8)}, path)
    monkeypatch.undo()
    with pytest.raises(checkpoint.CheckpointError, match=r"no checkpoint directory .* interrupted save left .*\.c\.old-"):
        checkpoint.load({"w": torch.zeros(16, 8)}, path)


def _plain_dcp_load_of_a_damaged_last_item(saved, tmp_path, planner=None, on_device=True):
    """Plain ``dcp.load`` (torch's FileSystemReader) into fresh targets; the data file's last item is cut."""
    import torch.distributed.checkpoint as dcp
    path = tmp_path / "cut"
    shutil.copytree(saved, path)
    os.truncate(path / "__0_0.distcp", (path / "__0_0.distcp").stat().st_size - 8)
    tgt = _targets(on_device)
    with pytest.raises(dcp.api.CheckpointException, match="central directory") as err:
        dcp.load(tgt, checkpoint_id=str(path), planner=planner, no_dist=True)
    return tgt, err.value


@pytest.mark.parametrize("planner", ["default", "ours"])
def test_plain_dcp_load_that_fails_leaves_device_targets_untouched(saved, tmp_path, planner):
    """Issue 41, item 3: with torch's own reader the items before the damaged one read fine; before, their
    tensors took the new values at once (all-or-nothing per tensor only). Now a load commits its device
    targets together once every one is filled, so each target still holds -1; a good load then fills all."""
    import torch.distributed.checkpoint as dcp
    from xla_dtensor.checkpoint.planners import LoadPlanner
    make = (lambda: None) if planner == "default" else LoadPlanner
    tgt, err = _plain_dcp_load_of_a_damaged_last_item(saved, tmp_path, make())
    for k in ("w", "u"):
        assert torch.equal(tgt[k].cpu(), torch.full(_values()[k].shape, -1.0)), (k, tgt[k].cpu(), err)
    dcp.load(tgt, checkpoint_id=str(saved), planner=make(), no_dist=True)  # the stale load does not block this one
    v = _values()
    assert torch.equal(tgt["w"].cpu(), v["w"]) and torch.equal(tgt["u"].cpu(), v["u"]) and tgt["meta"] == v["meta"]


def test_plain_dcp_load_commits_a_tensor_held_under_two_keys(tmp_path):
    """Tied weights: one device tensor planned twice (its staging buffer filled twice) still commits, and with
    the others (the load's group waits for every session, so a double fill must count as full)."""
    import torch.distributed.checkpoint as dcp
    v = _values()
    dcp.save({"a": v["w"], "b": v["w"], "u": v["u"]}, checkpoint_id=str(tmp_path / "tied"), no_dist=True)
    tgt = _targets(on_device=True)
    dcp.load({"a": tgt["w"], "b": tgt["w"], "u": tgt["u"]}, checkpoint_id=str(tmp_path / "tied"), no_dist=True)
    assert torch.equal(tgt["w"].cpu(), v["w"]) and torch.equal(tgt["u"].cpu(), v["u"])


def test_plain_dcp_load_with_our_planner_leaves_cpu_targets_and_values_untouched(saved, tmp_path):
    """Under torch's FileSystemReader, LoadPlanner stages CPU pieces and plain values and writes them after
    the plan's last item: a cut data file leaves w, u (CPU) and meta as they were; a good load fills all."""
    import torch.distributed.checkpoint as dcp
    from xla_dtensor.checkpoint.planners import LoadPlanner
    tgt, _ = _plain_dcp_load_of_a_damaged_last_item(saved, tmp_path, LoadPlanner(), on_device=False)
    v = _values()
    assert all(torch.equal(tgt[k], torch.full(v[k].shape, -1.0)) for k in ("w", "u")), tgt
    assert tgt["meta"] == {"step": 0}
    dcp.load(tgt, checkpoint_id=str(saved), planner=LoadPlanner(), no_dist=True)
    assert torch.equal(tgt["w"], v["w"]) and torch.equal(tgt["u"], v["u"]) and tgt["meta"] == v["meta"]
