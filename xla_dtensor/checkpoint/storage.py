"""DCP storage for xla_dtensor checkpoints: an atomic, checksummed writer and a verifying reader.

:class:`Writer` is torch's ``FileSystemWriter`` pointed at a staging sibling (one
``__{process}_0.distcp`` file per process); it adds each stored item's SHA-256 and each
file's size to a JSON manifest (:mod:`~xla_dtensor.checkpoint.manifest`), merges the
processes' parts on process 0, writes torch's ``.metadata`` and the manifest last, and
publishes the directory with one rename (:mod:`~xla_dtensor.checkpoint.publish`).

:class:`Reader` builds DCP's metadata from the manifest (never unpickling anything),
checks every file's size up front and every item's checksum before using its bytes,
and reads tensors with ``torch.load(weights_only=True)``. With ``allow_unverified=True``
it also reads a directory written by plain ``dcp.save`` (no manifest): its ``.metadata``
through an allow-list of DCP's metadata classes, with sizes and paths still checked.

Example:
    >>> import tempfile, torch, torch.distributed.checkpoint as dcp
    >>> path = tempfile.mkdtemp() + "/c"
    >>> _ = dcp.save({"w": torch.ones(2)}, storage_writer=Writer(path), no_dist=True)
    >>> sd = {"w": torch.zeros(2)}
    >>> dcp.load(sd, storage_reader=Reader(path), no_dist=True); sd["w"]
    tensor([1., 1.])
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, FileSystemWriter, _StoragePrefix
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner
from torch.distributed.checkpoint.storage import StorageReader, WriteResult
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.futures import Future

from xla_dtensor.checkpoint import manifest as M
from xla_dtensor.checkpoint import publish as P
from xla_dtensor.checkpoint.coord import Coordinator
from xla_dtensor.checkpoint.errors import CheckpointError

_CHUNK = 1 << 22


def _sha256(f: Any, offset: int, length: int, header: bytes = b"") -> str:
    f.seek(offset)
    h = hashlib.sha256(header)
    left = length
    while left:
        block = f.read(min(left, _CHUNK))
        if not block:
            break
        h.update(block)
        left -= len(block)
    return h.hexdigest()


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


class Writer(FileSystemWriter):
    """Writes a checkpoint of ``path`` atomically with checksums (see the module doc).

    Args:
        path: the checkpoint directory to create or replace (it must be absent, empty or a
            checkpoint: anything else is refused).
        timeout: seconds to wait for the other processes of a multi-process save.
    """

    def __init__(self, path: str | os.PathLike, *, timeout: float = 300.0) -> None:
        self.final = os.path.abspath(os.fspath(path))
        super().__init__(self.final, single_file_per_rank=True, sync_files=True, thread_count=1)
        self.timeout = timeout
        self.coord = Coordinator.single()
        self._records: dict[MetadataIndex, dict[str, Any]] = {}

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_writer(is_coordinator, *args, **kwargs)
        self.coord = Coordinator.for_save(self.final, self.timeout)
        if self.coord.rank == 0:
            P.check_replaceable(self.final)
            P.remove_dead_leftovers(self.final)
            tmp = P.staging_dir(self.final)
            os.makedirs(tmp)
            if self.coord.count > 1:
                self.coord.put("tmpdir", tmp)
        else:
            tmp = self.coord.get("tmpdir", sender=0, what="the staging directory")
        self.path = Path(tmp)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [dataclasses.replace(p, storage_data=_StoragePrefix(f"__{self.coord.rank}_")) for p in plans]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        fut = super().write_data(plan, planner)
        results: list[WriteResult] = fut.value()
        by_file: dict[str, list[WriteResult]] = {}
        for wr in results:
            by_file.setdefault(wr.storage_data.relative_path, []).append(wr)
        for name, wrs in by_file.items():
            with open(os.path.join(self.path, name), "rb") as f:
                for wr in wrs:
                    s = wr.storage_data
                    head = M.item_header(wr.index.fqn, wr.index.offset)  # NOTE: binds key and position
                    self._records[wr.index] = {"file": name, "offset": s.offset, "length": s.length,
                                               "sha256": _sha256(f, s.offset, s.length, head)}
        return fut

    def _part(self, metadata: Metadata, results: list[list[WriteResult]]) -> dict[str, Any]:
        """This process's entries and files, as JSON."""
        entries: dict[str, Any] = {}
        for wr in (w for ws in results for w in ws):
            md, rec = metadata.state_dict_metadata[wr.index.fqn], self._records[wr.index]
            if isinstance(md, BytesStorageMetadata):
                entries[wr.index.fqn] = {"kind": "bytes", **rec}
                continue
            e = entries.setdefault(wr.index.fqn, {"kind": "tensor", "dtype": M.dtype_name(md.properties.dtype),
                                                  "size": list(md.size), "chunks": []})
            offsets = tuple(wr.index.offset)
            sizes = next(tuple(c.sizes) for c in md.chunks if tuple(c.offsets) == offsets)
            e["chunks"].append({"offsets": list(offsets), "sizes": list(sizes), **rec})
        files = {r["file"]: {"size": os.path.getsize(os.path.join(self.path, r["file"]))}
                 for r in self._records.values()}
        planner_data = {k: list(v) for k, v in (metadata.planner_data or {}).items() if k in entries}
        return {"entries": entries, "files": files, "planner_data": planner_data}

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        part = self._part(metadata, results)
        parts = self.coord.gather("part", part, "its part of the checkpoint") if self.coord.count > 1 else [part]
        if self.coord.rank != 0:
            outcome = self.coord.get("commit", sender=0, what="whether the checkpoint was published")
            if outcome != "ok":
                raise CheckpointError(f"process 0 did not publish {self.final!r}: {outcome}")
            return
        try:
            self._commit(parts or [])
        except BaseException as err:
            if self.coord.count > 1:
                self.coord.put("commit", f"{type(err).__name__}: {err}")
            raise
        if self.coord.count > 1:
            self.coord.put("commit", "ok")

    def _commit(self, parts: list[dict[str, Any]]) -> None:
        m: dict[str, Any] = {"format": M.FORMAT, "version": M.VERSION, "processes": len(parts),
                             "entries": {}, "files": {}, "planner_data": {}}
        for part in parts:
            m["files"].update(part["files"])
            m["planner_data"].update(part["planner_data"])
            for key, e in part["entries"].items():
                have = m["entries"].setdefault(key, {**e, "chunks": []} if e["kind"] == "tensor" else e)
                if e["kind"] == "tensor":
                    have["chunks"].extend(e["chunks"])
        M.validate(m, self.final)
        md = M.to_metadata(m)
        md.version = CURRENT_DCP_VERSION
        blob = pickle.dumps(md)
        _write_file(os.path.join(self.path, M.DCP_METADATA), blob)
        m["files"][M.DCP_METADATA] = {"size": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}
        _write_file(os.path.join(self.path, M.NAME), json.dumps(m, indent=1).encode())
        P.publish(str(self.path), self.final)

    @property
    def checkpoint_id(self) -> str:
        return self.final


class Reader(StorageReader):
    """Reads (and verifies) a checkpoint directory; see the module doc."""

    def __init__(self, path: str | os.PathLike, *, allow_unverified: bool = False) -> None:
        super().__init__()
        self.path = os.path.abspath(os.fspath(path))
        self.allow_unverified = allow_unverified
        self._metadata: Metadata | None = None
        self._records: dict[tuple[str, Any], dict[str, Any]] | None = None
        self._bound = True  # version >= 2: checksums cover key and position

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id is not None:
            self.path = os.path.abspath(os.fspath(checkpoint_id))
            self._metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._metadata is None:
            self._metadata = self._read_metadata()
        return self._metadata

    def _read_metadata(self) -> Metadata:
        if not os.path.isdir(self.path):
            left = P.leftovers(self.path)
            hint = f"; an interrupted save left {left}" if left else ""
            raise CheckpointError(f"no checkpoint directory at {self.path!r}{hint}")
        names = set(os.listdir(self.path))
        if M.NAME in names:
            with open(os.path.join(self.path, M.NAME), "rb") as f:
                try:
                    raw = json.loads(f.read())
                except ValueError as err:
                    raise CheckpointError(f"{os.path.join(self.path, M.NAME)}: not valid JSON ({err})") from None
            m = M.validate(raw, os.path.join(self.path, M.NAME))
            self._check_files(m["files"])
            self._records = M.entry_digests(m)
            self._bound = m["version"] >= 2
            return M.to_metadata(m)
        if M.DCP_METADATA in names and self.allow_unverified:
            return self._read_plain_dcp()
        if M.DCP_METADATA in names:
            raise CheckpointError(f"{self.path!r} has no {M.NAME} (the commit mark of xla_dtensor.checkpoint.save): "
                                  f"an interrupted or foreign save. A checkpoint written by plain dcp.save loads "
                                  f"with allow_unverified=True (no checksums)")
        if "index.json" in names or any(n.startswith("index.") for n in names):
            raise CheckpointError(f"{self.path!r} is in the old xla_dtensor format (index.json + .npy), "
                                  f"which this version does not read")
        raise CheckpointError(f"{self.path!r} holds no checkpoint ({M.NAME} missing)")

    def _read_plain_dcp(self) -> Metadata:
        from xla_dtensor.checkpoint.safe_unpickle import load_dcp_metadata
        with open(os.path.join(self.path, M.DCP_METADATA), "rb") as f:
            md = load_dcp_metadata(f, os.path.join(self.path, M.DCP_METADATA))
        sizes: dict[str, int] = {}
        for idx, info in (md.storage_data or {}).items():
            name = M.check_file_name(getattr(info, "relative_path", None), f"{self.path}: {idx.fqn!r}")
            if getattr(info, "transform_descriptors", None):
                raise CheckpointError(f"{idx.fqn!r}: stream transforms {info.transform_descriptors} are not supported")
            full = os.path.join(self.path, name)
            if name not in sizes:
                if not os.path.isfile(full) or os.path.islink(full):
                    raise CheckpointError(f"{full}: missing (listed in {M.DCP_METADATA} for {idx.fqn!r})")
                sizes[name] = os.path.getsize(full)
            if info.offset < 0 or info.length < 0 or info.offset + info.length > sizes[name]:
                raise CheckpointError(f"{full}: truncated ({sizes[name]} bytes, {idx.fqn!r} needs bytes "
                                      f"{info.offset}..{info.offset + info.length})")
        self._records = None
        return md

    def _check_files(self, files: dict[str, Any]) -> None:
        """Every listed file exists with its size (and whole-file checksum where one is given)."""
        for name, info in files.items():
            full = os.path.join(self.path, name)
            if os.path.islink(full) or not os.path.isfile(full):
                raise CheckpointError(f"{full}: missing (the manifest lists it with {info['size']} bytes)")
            have = os.path.getsize(full)
            if have != info["size"]:
                raise CheckpointError(f"{full}: {have} bytes, the manifest says {info['size']} (truncated or altered)")
            if "sha256" in info:
                with open(full, "rb") as f:
                    if _sha256(f, 0, have) != info["sha256"]:
                        raise CheckpointError(f"{full}: checksum mismatch (the file was altered)")

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def _item_bytes(self, f: Any, index: MetadataIndex) -> bytes:
        info = self.storage_data[index]
        f.seek(info.offset)
        data = f.read(info.length)
        where = os.path.join(self.path, info.relative_path)
        if len(data) != info.length:
            raise CheckpointError(f"{where}: truncated ({index.fqn!r} needs bytes {info.offset}..{info.offset + info.length})")
        if self._records is not None:
            offsets = tuple(index.offset) if index.offset is not None else None
            rec = self._records.get((index.fqn, offsets))
            got = M.item_digest(index.fqn, offsets, data) if self._bound else hashlib.sha256(data).hexdigest()
            if rec is None or got != rec["sha256"]:
                place = f" at {list(offsets)}" if offsets is not None else ""
                raise CheckpointError(f"{where}: checksum mismatch in the bytes of {index.fqn!r}{place} (the file "
                                      f"was altered, or the manifest's records were swapped)")
        return data

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Verify every item this load reads, then write the targets: a failed load writes none of them.

        NOTE: two passes over the files (the second re-reads and re-checks each item) so that
        host memory holds one item at a time, not the whole checkpoint.
        """
        per_file: dict[str, dict[MetadataIndex, list[Any]]] = {}
        for req in plan.items:
            name = self.storage_data[req.storage_index].relative_path
            per_file.setdefault(name, {}).setdefault(req.storage_index, []).append(req)
        for write in (False, True):
            for name, items in per_file.items():
                with open(os.path.join(self.path, name), "rb") as f:
                    for index, reqs in items.items():
                        self._load_item(f, name, index, reqs, planner, write)
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _load_item(self, f: Any, name: str, index: MetadataIndex, reqs: list[Any], planner: LoadPlanner,
                   write: bool) -> None:
        """Read, check and decode one stored item; with ``write``, copy it into its targets."""
        data = self._item_bytes(f, index)
        if reqs[0].type == LoadItemType.BYTE_IO:
            if write:
                for req in reqs:
                    planner.load_bytes(req, io.BytesIO(data))
                return
            try:
                torch.load(io.BytesIO(data), weights_only=True)
            except Exception as err:
                raise CheckpointError(f"{index.fqn!r}: the stored value is not plain data torch.load(weights_only=True) "
                                      f"accepts ({type(err).__name__}: {str(err)[:200]})") from None
            return
        try:
            stored = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as err:
            raise CheckpointError(f"{os.path.join(self.path, name)}: the bytes of {index.fqn!r} are not a "
                                  f"plain tensor ({type(err).__name__}: {str(err)[:200]})") from None
        if not isinstance(stored, torch.Tensor):
            raise CheckpointError(f"{os.path.join(self.path, name)}: {index.fqn!r} holds no tensor")
        for req in reqs:
            src = narrow_tensor_by_index(stored, req.storage_offsets, req.lengths)
            dst = planner.resolve_tensor(req).detach()
            if dst.size() != src.size():
                raise CheckpointError(f"{index.fqn!r}: stored piece {tuple(src.size())} does not fit "
                                      f"its target {tuple(dst.size())}")
            if write:
                dst.copy_(src)
                planner.commit_tensor(req, dst)

    @property
    def checkpoint_id(self) -> str:
        return self.path

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))
