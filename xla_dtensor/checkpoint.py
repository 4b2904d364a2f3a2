"""Sharded checkpoints: every device's shard is written from its own buffer, never gathered.

Format (a directory):

* ``index.json``: ``{"version": 1, "tensors": {name: {"shape", "dtype", "layout",
  "shards": [{"file", "start", "stop"}]}}, "objects": "objects.pt"}``. ``layout`` is the
  HLO sharding string of the saved layout (informational); ``start``/``stop`` are the
  shard's index range in the global tensor.
* one ``.npy`` file per distinct shard (replica 0 only, so replicated data is written
  once); in several processes each process writes the shards its devices hold.
* ``objects.pt``: the non-tensor entries (``torch.save``).

Loading takes a state dict of *targets* (e.g. ``model.state_dict()`` of the sharded
model) and builds each tensor directly in the target's layout: every device reads only
the file ranges overlapping its own shard (memory-mapped). Layouts may differ between
save and load.

Example:
    >>> import tempfile, torch, xla_dtensor
    >>> from torch.distributed.tensor import Shard
    >>> from mesh import Mesh
    >>> m = Mesh(range(8), (8,), ("x",))
    >>> sd = {"w": xla_dtensor.distribute_tensor(torch.arange(16.).reshape(8, 2), m, [Shard(0)])}
    >>> path = tempfile.mkdtemp()
    >>> save(sd, path)
    >>> out = load({"w": xla_dtensor.distribute_tensor(torch.zeros(8, 2), m, [Shard(1)])}, path)
    >>> torch.equal(out["w"].cpu(), torch.arange(16.).reshape(8, 2))
    True
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import torch

from xla_dtensor.core.executor import materialize
from xla_dtensor.core.ir import data_leaf
from xla_dtensor.core.tensor import LazyTensor, value_of, write
from xla_dtensor.spmd import annotate as A
from xla_dtensor.spmd import layout as L

__all__ = ["save", "load"]
_INDEX = "index.json"


class CheckpointError(ValueError):
    """A checkpoint that does not match what is being loaded."""


def _device_array(t: LazyTensor) -> tuple[jax.Array, tuple[int, ...] | None]:
    """The data of ``t`` and, for an uneven (padded) layout, the padded shape."""
    src = L.padded_source(value_of(t)) if not t._chain else None
    if src is not None:
        return src.data, tuple(src.data.shape)
    arr = materialize(t)
    return (arr if isinstance(arr, jax.Array) else jax.device_put(arr)), None


def save(state_dict: dict[str, Any], path: str) -> None:
    """Write ``state_dict`` to directory ``path`` shard by shard (see the module doc)."""
    os.makedirs(path, exist_ok=True)
    from xla_dtensor.core.executor import sync
    sync()
    tensors, objects = {}, {}
    for name, t in state_dict.items():
        if isinstance(t, LazyTensor):
            tensors[name] = _save_tensor(t, name, path)
        else:
            objects[name] = t
    if jax.process_index() == 0:
        torch.save(objects, os.path.join(path, "objects.pt"))
    index = {"version": 1, "tensors": tensors, "objects": "objects.pt"}
    name = _INDEX if jax.process_count() == 1 else f"index.{jax.process_index()}.json"
    with open(os.path.join(path, name), "w") as f:
        json.dump(index, f, indent=1)


def _save_tensor(t: LazyTensor, name: str, path: str) -> dict[str, Any]:
    arr, _ = _device_array(t)
    shape = tuple(t.shape)
    shards = []
    for sh in arr.addressable_shards:
        if sh.replica_id != 0:
            continue
        idx = [(s.start or 0, min(s.stop if s.stop is not None else n, n)) for s, n in
               zip(sh.index, shape)] if shape else []
        if any(lo >= hi for lo, hi in idx):
            continue  # padding only
        data = np.asarray(sh.data)[tuple(slice(0, hi - lo) for lo, hi in idx)]
        fname = f"{_safe(name)}.{'_'.join(str(lo) for lo, _ in idx) or 's'}.npy"
        np.save(os.path.join(path, fname), _to_numpy_storable(data))
        shards.append({"file": fname, "start": [lo for lo, _ in idx], "stop": [hi for _, hi in idx]})
    return {"shape": list(shape), "dtype": str(t.dtype).removeprefix("torch."),
            "layout": A.get_hlo_sharding(t), "shards": shards}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name)


def _to_numpy_storable(data: np.ndarray) -> np.ndarray:
    return data.view(np.uint16) if data.dtype == jax.numpy.bfloat16 else data


def _read_index(path: str) -> dict[str, Any]:
    files = [f for f in os.listdir(path) if f == _INDEX or (f.startswith("index.") and f.endswith(".json"))]
    if not files:
        raise CheckpointError(f"{path!r} holds no checkpoint index ({_INDEX})")
    merged: dict[str, Any] = {"tensors": {}}
    for f in sorted(files):
        with open(os.path.join(path, f)) as fh:
            part = json.load(fh)
        for name, entry in part["tensors"].items():
            have = merged["tensors"].setdefault(name, {**entry, "shards": []})
            have["shards"].extend(entry["shards"])
    return merged


def load(state_dict: dict[str, Any], path: str) -> dict[str, Any]:
    """Fill the tensors of ``state_dict`` in place from ``path``; returns ``state_dict``.

    Each target keeps its layout; each device reads only the ranges of its own shard.

    Raises:
        CheckpointError: a name missing from the checkpoint, or a shape/dtype mismatch.
    """
    index = _read_index(path)
    objects = torch.load(os.path.join(path, "objects.pt"), weights_only=False)
    for name, t in state_dict.items():
        if not isinstance(t, LazyTensor):
            if name in objects:
                state_dict[name] = objects[name]
            continue
        entry = index["tensors"].get(name)
        if entry is None:
            raise CheckpointError(f"tensor {name!r} is not in the checkpoint at {path!r}; it has "
                                  f"{sorted(index['tensors'])}")
        if tuple(entry["shape"]) != tuple(t.shape) or entry["dtype"] != str(t.dtype).removeprefix("torch."):
            raise CheckpointError(f"{name!r}: checkpoint has shape {tuple(entry['shape'])} dtype "
                                  f"{entry['dtype']}, target has {tuple(t.shape)} {t.dtype}")
        _load_tensor(t, entry, path)
    return state_dict


def _load_tensor(t: LazyTensor, entry: dict[str, Any], path: str) -> None:
    arr, pshape = _device_array(t)
    shape = tuple(t.shape)
    gshape = pshape or shape
    np_dtype = np.dtype(arr.dtype) if arr.dtype != jax.numpy.bfloat16 else np.dtype(np.uint16)
    files = {s["file"]: None for s in entry["shards"]}

    def read(idx: tuple[slice, ...]) -> np.ndarray:
        lo = [s.start or 0 for s in idx] if gshape else []
        hi = [s.stop if s.stop is not None else n for s, n in zip(idx, gshape)] if gshape else []
        out = np.zeros([h - l for l, h in zip(lo, hi)], np_dtype)
        for s in entry["shards"]:
            a = [max(l, sl) for l, sl in zip(lo, s["start"])]
            b = [min(h, sh) for h, sh in zip(hi, s["stop"])]
            if any(x >= y for x, y in zip(a, b)):
                continue
            if files[s["file"]] is None:
                files[s["file"]] = np.load(os.path.join(path, s["file"]), mmap_mode="r")
            src = files[s["file"]][tuple(slice(x - o, y - o) for x, y, o in zip(a, b, s["start"]))]
            out[tuple(slice(x - l, y - l) for x, y, l in zip(a, b, lo))] = src
        return out.view(arr.dtype) if np_dtype != np.dtype(arr.dtype) else out

    new = jax.make_array_from_callback(gshape, arr.sharding, read)
    if pshape is not None:
        t._storage.value = L.unpad(data_leaf(new, pshape, t.dtype), shape, value_of(t).sharding)
        t._storage.version += 1
    elif t._chain:
        write(t, data_leaf(new, shape, t.dtype))
    else:
        t._storage.value = data_leaf(new, shape, t.dtype)
        t._storage.version += 1
