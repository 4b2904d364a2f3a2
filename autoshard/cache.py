"""On-disk plan cache: one JSON file per (graph, mesh, topology, budget, time limit, autoshard code).

The directory is ``$XLA_DTENSOR_CACHE_DIR/plans`` when that variable is set, else
``~/.cache/xla_dtensor/plans`` (next to the compile cache). Files are written
atomically (a temporary file in the same directory, then ``os.replace``), so a reader
never sees half a plan. The key includes a hash of autoshard's own source, so a
changed cost model or rule never serves a stale plan. A directory that cannot be
created, read or written, and a file that does not parse, give a
:class:`PlanCacheWarning` and the caller solves as if uncached. A plan that parses is
still checked against the graph and mesh it is served for (:func:`plan_mismatch`: mesh
axes and sizes, one placement per placeholder, every spec one valid entry per mesh axis
splitting a dim the tensor has, shapes): one that does not fit warns and is solved again.

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


def _spec_problem(spec: Any, nd: int, ndim: int) -> str | None:
    if not isinstance(spec, tuple) or len(spec) != nd:
        return f"has {len(spec) if isinstance(spec, tuple) else spec!r} entries, the mesh has {nd} axes"
    for p in spec:
        if p in ("R", "P"):
            continue
        if not (isinstance(p, tuple) and len(p) == 2 and p[0] == "S" and type(p[1]) is int):
            return f"has placement {p!r}; expected 'R', 'P' or ('S', dim)"
        if not 0 <= p[1] < ndim:
            return f"splits dim {p[1]} of a {ndim}-d tensor"
    return None


def plan_mismatch(plan: Plan, graph: Any, topology: Any, mesh: Any = None) -> str | None:
    """Why ``plan`` does not fit ``graph`` on ``topology`` (and ``mesh``), or None when it does.

    Example:
        >>> from autoshard.graph import Graph, TensorMeta
        >>> from mesh import Mesh, topology_for
        >>> g = Graph(); _ = g.add("placeholder", (), (TensorMeta((4, 2)),), role="param", name="w")
        >>> topo = topology_for(Mesh(range(2), (2,), ("d",), validate=False), "tpu-v5e")
        >>> plan_mismatch(Plan(("d",), (2,), "v5e", placements={"w": (("S", 99),)}), g, topo)
        "placement of 'w' (('S', 99),) splits dim 99 of a 2-d tensor"
    """
    axes, sizes = tuple(topology.axis_names), tuple(topology.axis_sizes)
    if tuple(plan.mesh_axes) != axes or tuple(plan.mesh_shape) != sizes:
        return f"plan is for mesh {list(plan.mesh_axes)} {list(plan.mesh_shape)}, the solve for {list(axes)} {list(sizes)}"
    shape = getattr(mesh, "mesh_shape", None)
    if shape is not None and tuple(shape) != sizes:
        return f"plan is for mesh shape {list(sizes)}, the mesh is {list(shape)}"
    shapes = {n.name: tuple(n.out.shape) for n in graph.nodes if n.outputs}
    holders = {n.name for n in graph.nodes if n.op == "placeholder"}
    if set(plan.placements) != holders:
        missing, extra = sorted(holders - set(plan.placements)), sorted(set(plan.placements) - holders)
        return f"placements do not match the graph's inputs (missing {missing[:5]}, unknown {extra[:5]})"
    for kind, table in (("placement", plan.placements), ("activation", plan.activations)):
        for name, spec in table.items():
            if name not in shapes:  # NOTE: a clustered plan may name nodes of its reduced graph
                continue
            why = _spec_problem(spec, len(axes), len(shapes[name]))
            if why:
                return f"{kind} of {name!r} {spec!r} {why}"
    bad = next((k for k, v in plan.shapes.items() if k in shapes and tuple(v) != shapes[k]), None)
    if bad is not None:
        return f"shape of {bad!r} is {list(plan.shapes[bad])}, the graph's is {list(shapes[bad])}"
    return None


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
