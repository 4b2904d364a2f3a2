"""Read plain DCP's pickled ``.metadata`` without running foreign code: an allow-list unpickler.

Only DCP's own metadata classes, ``torch.Size``, torch dtypes/layouts and paths may be
named by the pickle; anything else (``os.system``, ``builtins.eval``, any other
``__reduce__`` target) is a :class:`CheckpointError` before it is called.

Example:
    >>> import io, pickle
    >>> evil = pickle.dumps(print)
    >>> load_dcp_metadata(io.BytesIO(evil), "x")
    Traceback (most recent call last):
    ...
    xla_dtensor.checkpoint.errors.CheckpointError: x: the pickle names builtins.print, which a DCP metadata file never holds; refusing to load it
"""
from __future__ import annotations

import pickle
from typing import IO, Any

import torch
from torch.distributed.checkpoint.metadata import Metadata

from xla_dtensor.checkpoint.errors import CheckpointError

_DCP_MD = "torch.distributed.checkpoint.metadata"
_ALLOWED = {
    (_DCP_MD, n) for n in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                           "TensorProperties", "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("collections", "OrderedDict"),
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"), ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
}


class _Unpickler(pickle.Unpickler):
    def __init__(self, f: IO[bytes], where: str) -> None:
        super().__init__(f)
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointError(f"{self.where}: the pickle names {module}.{name}, which a DCP metadata file "
                              f"never holds; refusing to load it")


def load_dcp_metadata(f: IO[bytes], where: str) -> Metadata:
    """The ``Metadata`` pickled in ``f``, refusing every class outside the allow-list."""
    try:
        md = _Unpickler(f, where).load()
    except CheckpointError:
        raise
    except Exception as err:  # a truncated or garbled pickle
        raise CheckpointError(f"{where}: unreadable DCP metadata ({type(err).__name__}: {err})") from None
    if not isinstance(md, Metadata):
        raise CheckpointError(f"{where}: holds {type(md).__name__}, not DCP Metadata")
    return md
