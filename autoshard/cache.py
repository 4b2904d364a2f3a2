"""On-disk plan cache: one JSON file per (graph, mesh, topology, budget, time limit, autoshard code).

The directory is ``$XLA_DTENSOR_CACHE_DIR/plans`` when that variable is set, else
``~/.cache/xla_dtensor/plans`` (next to the compile cache). Files are written
atomically (a temporary file in the same directory, then ``os.replace``), so a reader
never sees half a plan. The key includes a hash of autoshard's own source, so a
changed cost model or rule never serves a stale plan. A directory that cannot be
created, read or written, and a file that does not parse, give a
:class:`PlanCacheWarning` and the caller solves as if uncached.

Example:
    >>> import tempfile
    >>> from autoshard.plan import Plan
    >>> cache = PlanCache(tempfile.mkdtemp())
    >>> cache.put("k", Plan(mesh_axes=("d",), mesh_shape=(2,), topology="cpu"))
    >>> cache.get("k").mesh_shape, cache.get("missing")
    ((2,), None)
"""
from __future__ import annotations

import functools
import hashlib
import os
import tempfile
import warnings
from pathlib import Path
from typing import Any

from autoshard.plan import Plan

ENV_VAR = "XLA_DTENSOR_CACHE_DIR"
_FORMAT = 1


class PlanCacheWarning(UserWarning):
    """The plan cache could not be used (unusable directory, corrupted file); solving uncached."""


def default_dir() -> Path:
    """``$XLA_DTENSOR_CACHE_DIR/plans`` or ``~/.cache/xla_dtensor/plans``."""
    root = os.environ.get(ENV_VAR)
    return Path(root) / "plans" if root else Path.home() / ".cache" / "xla_dtensor" / "plans"


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of autoshard's and mesh's Python sources (a code change invalidates cached plans)."""
    h = hashlib.sha256(str(_FORMAT).encode())
    import mesh

    for pkg in (Path(__file__).parent, Path(mesh.__file__).parent):
        for f in sorted(pkg.rglob("*.py")):
            h.update(f.relative_to(pkg.parent).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def plan_key(graph: Any, mesh: Any, topology: Any, memory_budget: float | None, time_limit: float,
             pinned: tuple = ()) -> str:
    """A process-independent key (Python's ``hash`` of strings is salted per process, so no ``hash``).

    ``pinned``: sorted ``(name, spec)`` pairs of user-pinned placements (empty: no pins).
    """
    mesh_key = None if mesh is None else (type(mesh).__name__, getattr(mesh, "_key", lambda: repr(mesh))())
    parts = (graph.fingerprint(), mesh_key, repr(topology), memory_budget, float(time_limit), code_version())
    text = repr(parts + (tuple(pinned),) if pinned else parts)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class PlanCache:
    """Plans stored as ``<directory>/<key>.json`` (see module docstring)."""

    def __init__(self, directory: str | os.PathLike | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_dir()
        self.usable = True
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            if not os.access(self.directory, os.R_OK | os.X_OK):
                raise PermissionError(f"directory {self.directory} is not readable")
        except OSError as err:
            self._disable(f"cannot use plan cache directory {self.directory} ({err}); solving without the disk cache")

    def _disable(self, msg: str) -> None:
        self.usable = False
        warnings.warn(msg, PlanCacheWarning, stacklevel=3)

    def path(self, key: str) -> Path:
        return self.directory / f"{key}.json"

    def get(self, key: str) -> Plan | None:
        """The cached plan, or None (missing, unreadable or corrupted: the latter two warn)."""
        if not self.usable:
            return None
        p = self.path(key)
        try:
            text = p.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as err:
            warnings.warn(f"cannot read cached plan {p} ({err}); solving again", PlanCacheWarning, stacklevel=2)
            return None
        try:  # NOTE: JSON only (never pickle); bytes that are not UTF-8 are a corrupted file too
            return Plan.from_json(text.decode("utf-8"))
        except (ValueError, KeyError, TypeError, AttributeError, IndexError, RecursionError) as err:
            warnings.warn(f"cached plan {p} is corrupted ({type(err).__name__}: {err}); solving again",
                          PlanCacheWarning, stacklevel=2)
            return None

    def put(self, key: str, plan: Plan) -> None:
        """Store ``plan`` atomically; a failed write warns once and disables the cache."""
        if not self.usable:
            return
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{key}.", suffix=".tmp", dir=self.directory)
            with os.fdopen(fd, "w") as f:
                f.write(plan.to_json())
            os.replace(tmp, self.path(key))
            tmp = None
        except OSError as err:
            self._disable(f"cannot write plan cache directory {self.directory} ({err}); solving without the disk cache")
        finally:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass


def open_cache(cache_dir: str | os.PathLike | bool | None) -> PlanCache | None:
    """``cache_dir`` as :func:`autoshard.solve` takes it: None/True -> default dir, False -> no disk cache."""
    if cache_dir is False:
        return None
    if cache_dir is None or cache_dir is True:
        return PlanCache()
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a path, None (default {default_dir()}) or False, got {cache_dir!r}")
    return PlanCache(cache_dir)
