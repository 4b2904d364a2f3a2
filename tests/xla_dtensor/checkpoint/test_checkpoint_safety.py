"""Loading never runs foreign code, never reads outside the directory, never fills a target wrong.

One test per case of issue 23 ("Why", checkpoints) and the refusals of issue 21: a pickle
payload in each place a file can carry one, paths leaving the directory or pointing at
another piece, keys that a file-name encoding would merge, CPU and device targets,
targets that cannot be filled. Each refusal is a CheckpointError naming the file or key.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
from mesh import Mesh
from xla_dtensor import checkpoint
from xla_dtensor.checkpoint import CheckpointError
from xla_dtensor.checkpoint.manifest import item_digest

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
MANIFEST = ".xdt_manifest.json"


class _Payload:
    """Unpickling this creates the marker file: proof that foreign code ran."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').close()",))


def _mesh():
    return Mesh(range(8), (8,), ("x",))


def _saved(tmp_path, **values):
    sd = {"w": xla_dtensor.distribute_tensor(torch.arange(16.).reshape(8, 2), _mesh(), [Shard(0)]), **values}
    checkpoint.save(sd, tmp_path / "c")
    return tmp_path / "c"


def _manifest(path):
    return json.loads((path / MANIFEST).read_text())


def _rewrite(path, m):
    (path / MANIFEST).write_text(json.dumps(m))


def _append_item(path, m, key, blob, chunk=None):
    """Append ``blob`` to the data file and point ``key`` (or its chunk) at it, checksums updated:
    what a malicious writer who controls every file can do."""
    data = path / "__0_0.distcp"
    offset = data.stat().st_size
    with open(data, "ab") as f:
        f.write(blob)
    rec = m["entries"][key] if chunk is None else m["entries"][key]["chunks"][chunk]
    rec.update(offset=offset, length=len(blob),
               sha256=item_digest(key, None if chunk is None else rec["offsets"], blob))
    m["files"]["__0_0.distcp"]["size"] = data.stat().st_size
    _rewrite(path, m)


def _target():
    return {"w": torch.zeros(8, 2)}


def test_a_pickle_payload_as_a_stored_value_is_refused_and_not_run(tmp_path):
    path, marker = _saved(tmp_path, step=3), str(tmp_path / "ran")
    buf = io.BytesIO()
    torch.save(_Payload(marker), buf)
    _append_item(path, _manifest(path), "step", buf.getvalue())
    with pytest.raises(CheckpointError, match="'step'.*weights_only"):
        checkpoint.load({**_target(), "step": 0}, path)
    assert not os.path.exists(marker)


def test_a_pickle_payload_in_place_of_a_tensor_is_refused_and_not_run(tmp_path):
    path, marker = _saved(tmp_path), str(tmp_path / "ran")
    _append_item(path, _manifest(path), "w", pickle.dumps(_Payload(marker)), chunk=0)
    with pytest.raises(CheckpointError, match="__0_0.distcp.*'w'.*not a plain tensor"):
        checkpoint.load(_target(), path)
    assert not os.path.exists(marker)


def test_a_pickle_payload_in_plain_dcp_metadata_is_refused_and_not_run(tmp_path):
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "c"))
    marker = str(tmp_path / "ran")
    (tmp_path / "c" / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    with pytest.raises(CheckpointError, match=r"\.metadata: the pickle names builtins\.exec"):
        checkpoint.load({"w": torch.zeros(2)}, tmp_path / "c", allow_unverified=True)
    assert not os.path.exists(marker)


@pytest.mark.parametrize("file", ["ABSOLUTE", "../outside.distcp", "sub/__0_0.distcp", ".", ""])
def test_a_shard_path_outside_the_directory_is_refused(tmp_path, file):
    path = _saved(tmp_path)
    outside = tmp_path / "outside.distcp"
    buf = io.BytesIO()
    torch.save(torch.full((1, 2), 666.0), buf)
    outside.write_bytes(buf.getvalue())
    m = _manifest(path)
    file = str(outside) if file == "ABSOLUTE" else file
    m["entries"]["w"]["chunks"][0]["file"] = file
    m["files"][file] = {"size": outside.stat().st_size}
    _rewrite(path, m)
    with pytest.raises(CheckpointError, match="not a plain file name inside the checkpoint"):
        checkpoint.load(_target(), path)


def test_a_shard_pointing_at_another_piece_is_refused(tmp_path):
    path = _saved(tmp_path)
    m = _manifest(path)
    a, b = m["entries"]["w"]["chunks"][:2]
    a["offset"], a["length"] = b["offset"], b["length"]  # piece 0 claims piece 1's bytes
    _rewrite(path, m)
    with pytest.raises(CheckpointError, match="__0_0.distcp: checksum mismatch in the bytes of 'w'"):
        checkpoint.load(_target(), path)


def test_plain_dcp_metadata_with_an_absolute_path_is_refused(tmp_path):
    dcp.save({"w": torch.ones(2)}, checkpoint_id=str(tmp_path / "c"))
    md_file = tmp_path / "c" / ".metadata"
    md = pickle.loads(md_file.read_bytes())
    md.storage_data = {k: dataclasses.replace(v, relative_path=str(tmp_path / "c" / v.relative_path))
                       for k, v in md.storage_data.items()}
    assert all(isinstance(v, _StorageInfo) for v in md.storage_data.values())
    md_file.write_bytes(pickle.dumps(md))
    with pytest.raises(CheckpointError, match="not a plain file name"):
        checkpoint.load({"w": torch.zeros(2)}, tmp_path / "c", allow_unverified=True)


def test_keys_that_a_file_name_encoding_would_merge_stay_distinct(tmp_path):
    src = {"a/b": torch.tensor([1., 1.]), "a_b": torch.tensor([7., 7.]), "a b": torch.tensor([3., 3.]),
           "a\\b": torch.tensor([4., 4.]), "../a": torch.tensor([5., 5.])}
    checkpoint.save({k: v.to(xla_dtensor.device()) for k, v in src.items()}, tmp_path / "c")
    assert sorted(os.listdir(tmp_path / "c")) == [".metadata", MANIFEST, "__0_0.distcp"]  # no key in a file name
    out = checkpoint.load({k: torch.zeros(2) for k in src}, tmp_path / "c")
    for k, v in src.items():
        assert torch.equal(out[k], v), k


def test_nested_and_dotted_keys_that_flatten_alike_are_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="flatten to the same key.*a.b"):
        checkpoint.save({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}, tmp_path / "c")


def test_cpu_and_device_targets_both_load(dev, tmp_path):
    path = _saved(tmp_path)
    expected = torch.arange(16.).reshape(8, 2)
    for target in (torch.zeros(8, 2), torch.zeros(8, 2).to(dev),
                   xla_dtensor.distribute_tensor(torch.zeros(8, 2), Mesh(range(8), (2, 4), ("a", "b")),
                                                 [Replicate(), Shard(1)])):
        out = checkpoint.load({"w": target}, path)
        assert out["w"] is target and torch.equal(target.cpu(), expected), target.device


@pytest.mark.parametrize("target, match", [
    ({"w": torch.zeros(8, 2), "missing": torch.zeros(1)}, "key 'missing' is not in the checkpoint"),
    ({"w": 0}, "'w': the checkpoint holds a tensor .* the target is a int"),
    ({"w": torch.zeros(2, 8)}, r"'w': the checkpoint holds \(8, 2\) torch.float32, the target is \(2, 8\)"),
    ({"w": torch.zeros(8, 2, dtype=torch.float64)}, "'w': .* the target is .* torch.float64"),
    ({"w": torch.zeros(8, 2), "step": torch.zeros(1)}, "'step': the checkpoint holds a non-tensor value"),
])
def test_a_target_that_cannot_be_filled_is_an_error_naming_its_key(tmp_path, target, match):
    path = _saved(tmp_path, step=3)
    before = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in target.items()}
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(target, path)
    for k, v in before.items():  # refused before anything was read
        assert (torch.equal(target[k], v) if isinstance(v, torch.Tensor) else target[k] == v), k


def test_stored_pieces_that_do_not_cover_a_target_are_an_error(tmp_path):
    path = _saved(tmp_path)
    m = _manifest(path)
    del m["entries"]["w"]["chunks"][3]
    _rewrite(path, m)
    with pytest.raises(CheckpointError, match="'w': its chunks hold 14 of its 16 elements"):
        checkpoint.load(_target(), path)


def test_a_value_that_could_not_be_loaded_back_is_refused_at_save(tmp_path):
    with pytest.raises(CheckpointError, match="'obj': a _Payload cannot be stored"):
        checkpoint.save({"obj": _Payload(str(tmp_path / "x"))}, tmp_path / "c")
    assert not (tmp_path / "c").exists() and not os.path.exists(tmp_path / "x")


def test_save_refuses_to_replace_a_directory_that_is_not_a_checkpoint(tmp_path):
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(CheckpointError, match="not a checkpoint.*refusing to replace it"):
        checkpoint.save({"w": torch.ones(1)}, tmp_path / "c")
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


def test_loading_what_is_not_a_checkpoint_names_the_problem(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoint directory"):
        checkpoint.load(_target(), tmp_path / "nothing")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "index.json").write_text("{}")
    with pytest.raises(CheckpointError, match="old xla_dtensor format"):
        checkpoint.load(_target(), tmp_path / "old")


def test_bad_arguments_name_the_value(tmp_path):
    with pytest.raises(ValueError, match="timeout must be a positive number of seconds, got nan"):
        checkpoint.save({"w": torch.ones(1)}, tmp_path / "c", timeout=float("nan"))
    with pytest.raises(TypeError, match="state_dict must be a dict .* got list"):
        checkpoint.save([torch.ones(1)], tmp_path / "c")
    with pytest.raises(TypeError, match="path must be a non-empty str or os.PathLike directory, got None"):
        checkpoint.load({"w": torch.ones(1)}, None)
    assert not (tmp_path / "c").exists()


def _three(dev, tmp_path, on_device):
    """A checkpoint of a, b, c (c stored last) and targets holding -1 on CPU or on the device."""
    mesh = Mesh(range(8), (2, 4), ("a", "b"))
    vals = {k: torch.arange(32.).reshape(8, 4) + 100 * i for i, k in enumerate("abc")}
    checkpoint.save({k: xla_dtensor.distribute_tensor(v, mesh, [Shard(0), Replicate()]) for k, v in vals.items()},
                    tmp_path / "c")
    if on_device:
        tgt = {k: xla_dtensor.distribute_tensor(torch.full((8, 4), -1.0), mesh, [Replicate(), Shard(1)]) for k in "abc"}
    else:
        tgt = {k: torch.full((8, 4), -1.0) for k in "abc"}
    return tmp_path / "c", tgt


@pytest.mark.parametrize("on_device", [False, True], ids=["cpu", "device"])
def test_a_failed_load_leaves_every_target_as_it_was(dev, tmp_path, on_device):
    """Issue 41, item 3: the last chunk of 'c' damaged -> an error and a, b, c all still -1 (before: a and b
    overwritten, with CPU targets c partly)."""
    path, tgt = _three(dev, tmp_path, on_device)
    m = _manifest(path)
    last = max(m["entries"]["c"]["chunks"], key=lambda c: c["offset"])
    data = bytearray((path / last["file"]).read_bytes())
    data[last["offset"] + last["length"] - 3] ^= 0x5A
    (path / last["file"]).write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch in the bytes of 'c'"):
        checkpoint.load(tgt, path)
    for k, t in tgt.items():
        assert torch.equal(t.cpu(), torch.full((8, 4), -1.0)), k
    data[last["offset"] + last["length"] - 3] ^= 0x5A  # the control: repaired, the same targets fill exactly
    (path / last["file"]).write_bytes(bytes(data))
    checkpoint.load(tgt, path)
    for i, k in enumerate("abc"):
        assert torch.equal(tgt[k].cpu(), torch.arange(32.).reshape(8, 4) + 100 * i), k


@pytest.mark.parametrize("swap", ["two chunks of one tensor", "chunks of two tensors"])
def test_swapped_chunk_records_are_an_error(tmp_path, swap):
    path, tgt = _three(None, tmp_path, False)
    m = _manifest(path)
    a, b = (m["entries"]["a"]["chunks"][:2] if swap == "two chunks of one tensor"
            else (m["entries"]["a"]["chunks"][0], m["entries"]["b"]["chunks"][0]))
    fields = ("file", "offset", "length", "sha256")  # where the bytes are, with their checksum
    for f in fields:
        a[f], b[f] = b[f], a[f]
    _rewrite(path, m)
    with pytest.raises(CheckpointError, match="checksum mismatch .*records were swapped"):
        checkpoint.load(tgt, path)
    assert all(torch.equal(t, torch.full((8, 4), -1.0)) for t in tgt.values())
