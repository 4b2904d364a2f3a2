"""The manifest: a checkpoint's table of contents as plain JSON, written last as its commit mark.

``.xdt_manifest.json`` in a checkpoint directory lists every entry of the state dict
(key, kind, dtype, size, and for each stored chunk: its file, byte range and SHA-256)
and every file with its size. From version 2 a chunk's SHA-256 covers its key and
position (:func:`item_digest`) before its bytes, so two records swapped in the manifest
(each with its own checksum) no longer verify; version 1 (bytes only) is still read.
Keys are JSON strings, so any two distinct keys stay distinct. Our reader builds torch.distributed.checkpoint's ``Metadata`` from it and never
reads the pickled ``.metadata`` (that file is written for plain ``dcp.load``).

Everything read from a manifest is validated before use: file names are plain names
inside the directory, chunks lie inside their tensor and cover it without overlap.

Example:
    >>> m = {"format": FORMAT, "version": VERSION, "processes": 1, "planner_data": {},
    ...      "files": {"__0_0.distcp": {"size": 8}},
    ...      "entries": {"w": {"kind": "tensor", "dtype": "float32", "size": [2], "chunks": [
    ...          {"offsets": [0], "sizes": [2], "file": "__0_0.distcp", "offset": 0, "length": 8,
    ...           "sha256": "0" * 64}]}}}
    >>> md = to_metadata(validate(m, "ckpt"))
    >>> md.state_dict_metadata["w"].size
    torch.Size([2])
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

from xla_dtensor.checkpoint.errors import CheckpointError

NAME = ".xdt_manifest.json"
FORMAT, VERSION = "xla_dtensor.checkpoint", 2
READS = (1, 2)  # version 1: checksums over the bytes only
DCP_METADATA = ".metadata"


def item_header(key: str, offsets: Any) -> bytes:
    """What a version-2 checksum hashes before an item's bytes: its key and chunk offsets (None: a value)."""
    return json.dumps([key, None if offsets is None else [int(o) for o in offsets]]).encode() + b"\n"


def item_digest(key: str, offsets: Any, data: bytes) -> str:
    """The version-2 SHA-256 of a stored item: key, position, bytes.

    Example:
        >>> item_digest("w", [0], b"") != item_digest("w", [4], b"")
        True
    """
    return hashlib.sha256(item_header(key, offsets) + data).hexdigest()


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def parse_dtype(name: Any, where: str) -> torch.dtype:
    dt = getattr(torch, name, None) if isinstance(name, str) and name.isidentifier() else None
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"{where}: unknown dtype {name!r}")
    return dt


def check_file_name(name: Any, where: str) -> str:
    """``name`` if it is a plain file name (relative, normalized, no separator, not a dot name)."""
    ok = (isinstance(name, str) and name not in ("", ".", "..") and os.path.basename(name) == name
          and "/" not in name and "\\" not in name and "\0" not in name and os.path.normpath(name) == name)
    if not ok:
        raise CheckpointError(f"{where}: file {name!r} is not a plain file name inside the checkpoint "
                              f"directory (absolute paths, '..' and sub-directories are refused)")
    return name


def _ints(v: Any, where: str) -> tuple[int, ...]:
    if not isinstance(v, list) or not all(type(x) is int and x >= 0 for x in v):
        raise CheckpointError(f"{where}: expected a list of non-negative integers, got {v!r}")
    return tuple(v)


def _byte_range(c: dict[str, Any], files: dict[str, Any], where: str) -> None:
    check_file_name(c.get("file"), where)
    if c["file"] not in files:
        raise CheckpointError(f"{where}: file {c['file']!r} is not listed in the manifest's files")
    off, n = c.get("offset"), c.get("length")
    if type(off) is not int or type(n) is not int or off < 0 or n < 0 or off + n > files[c["file"]]["size"]:
        raise CheckpointError(f"{where}: byte range offset={off!r} length={n!r} is outside file "
                              f"{c['file']!r} of {files[c['file']]['size']} bytes")
    if not (isinstance(c.get("sha256"), str) and len(c["sha256"]) == 64):
        raise CheckpointError(f"{where}: missing or malformed sha256")


def coverage_error(size: tuple[int, ...], chunks: list[tuple[tuple[int, ...], tuple[int, ...]]]) -> str | None:
    """Why ``chunks`` (offsets, sizes) do not tile a tensor of ``size`` exactly, or None."""
    if not size:
        return None if len(chunks) == 1 else f"{len(chunks)} chunks for a 0-d tensor"
    for off, sz in chunks:
        if len(off) != len(size) or len(sz) != len(size) or any(o + s > n for o, s, n in zip(off, sz, size)):
            return f"chunk at {list(off)} of size {list(sz)} lies outside the tensor of size {list(size)}"
    ordered = sorted(chunks)
    for i, (a_off, a_sz) in enumerate(ordered):
        for b_off, b_sz in ordered[i + 1:]:
            if b_off[0] >= a_off[0] + a_sz[0]:
                break
            if all(bo < ao + asz and ao < bo + bsz for ao, asz, bo, bsz in zip(a_off, a_sz, b_off, b_sz)):
                return f"chunks at {list(a_off)} and {list(b_off)} overlap"
    have, need = sum(math.prod(sz) for _, sz in chunks), math.prod(size)
    if have != need:
        return f"its chunks hold {have} of its {need} elements"
    return None


def validate(m: Any, where: str) -> dict[str, Any]:
    """``m`` (a parsed manifest) checked for shape; CheckpointError names the first problem."""
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointError(f"{where}: not an xla_dtensor checkpoint manifest")
    if m.get("version") not in READS:
        raise CheckpointError(f"{where}: manifest version {m.get('version')!r}, this code reads {list(READS)}")
    files = m.get("files")
    if not isinstance(files, dict):
        raise CheckpointError(f"{where}: manifest has no file table")
    for name, info in files.items():
        check_file_name(name, where)
        if not isinstance(info, dict) or type(info.get("size")) is not int or info["size"] < 0:
            raise CheckpointError(f"{where}: file {name!r} has no valid size")
    entries = m.get("entries")
    if not isinstance(entries, dict) or not isinstance(m.get("planner_data"), dict):
        raise CheckpointError(f"{where}: manifest has no entry table")
    for key, e in entries.items():
        at = f"{where}: entry {key!r}"
        if not isinstance(e, dict) or e.get("kind") not in ("tensor", "bytes"):
            raise CheckpointError(f"{at}: unknown kind")
        if e["kind"] == "bytes":
            _byte_range(e, files, at)
            continue
        parse_dtype(e.get("dtype"), at)
        size = _ints(e.get("size"), f"{at} size")
        chunks = e.get("chunks")
        if not isinstance(chunks, list):
            raise CheckpointError(f"{at}: no chunk list")
        boxes = []
        for c in chunks:
            if not isinstance(c, dict):
                raise CheckpointError(f"{at}: malformed chunk {c!r}")
            boxes.append((_ints(c.get("offsets"), f"{at} offsets"), _ints(c.get("sizes"), f"{at} sizes")))
            _byte_range(c, files, at)
        problem = coverage_error(size, boxes)
        if problem:
            raise CheckpointError(f"{at}: {problem} (a part of the checkpoint is missing or altered)")
    for key, path in m["planner_data"].items():
        if key not in entries or not isinstance(path, list) or not all(isinstance(p, (str, int)) for p in path):
            raise CheckpointError(f"{where}: malformed planner_data for {key!r}")
    return m


def to_metadata(m: dict[str, Any]) -> Metadata:
    """DCP ``Metadata`` (with storage data) for a validated manifest."""
    sd_md: dict[str, Any] = {}
    storage: dict[MetadataIndex, _StorageInfo] = {}
    for key, e in m["entries"].items():
        if e["kind"] == "bytes":
            sd_md[key] = BytesStorageMetadata()
            storage[MetadataIndex(key)] = _StorageInfo(e["file"], e["offset"], e["length"])
            continue
        props = TensorProperties(dtype=parse_dtype(e["dtype"], key))
        chunks = [ChunkStorageMetadata(torch.Size(c["offsets"]), torch.Size(c["sizes"])) for c in e["chunks"]]
        sd_md[key] = TensorStorageMetadata(props, torch.Size(e["size"]), chunks)
        for c in e["chunks"]:
            storage[MetadataIndex(key, torch.Size(c["offsets"]))] = _StorageInfo(c["file"], c["offset"], c["length"])
    planner_data = {k: tuple(v) for k, v in m["planner_data"].items()}
    return Metadata(state_dict_metadata=sd_md, planner_data=planner_data, storage_data=storage)


def entry_digests(m: dict[str, Any]) -> dict[tuple[str, tuple[int, ...] | None], dict[str, Any]]:
    """``(key, chunk offsets or None)`` -> that stored item's record (file, offset, length, sha256)."""
    out: dict[tuple[str, tuple[int, ...] | None], dict[str, Any]] = {}
    for key, e in m["entries"].items():
        if e["kind"] == "bytes":
            out[(key, None)] = e
        else:
            for c in e["chunks"]:
                out[(key, tuple(c["offsets"]))] = c
    return out
