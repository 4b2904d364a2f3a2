"""Runtime services: the persistent compilation cache, XLA compile counters, and (re-exported
from :mod:`xla_dtensor.runtime_dist`) device counts, ``use_spmd`` and multi-process start.

``initialize_cache(path)`` turns on JAX's persistent compilation cache in ``path``
with no size or compile-time threshold, so every executable (also the small ones of
tests and eager ops) is written, and a later process loads it instead of running XLA.
The counters ``xla_compiles`` (XLA backend compilations actually run) and
``persistent_cache_hits`` (executables loaded from disk) are kept in
``xla_dtensor.metrics`` from JAX's monitoring events.

Example:
    >>> import tempfile, xla_dtensor
    >>> xla_dtensor.runtime.initialize_cache(tempfile.mkdtemp())
    True
"""
from __future__ import annotations

import os
import tempfile
import warnings

import jax
from jax import monitoring

from xla_dtensor import metrics

from xla_dtensor.runtime_dist import *  # noqa: F401,F403,E402
from xla_dtensor.runtime_dist import __all__ as _dist_all

__all__ = ["CacheWarning", "initialize_cache", "cache_path", "device_count", *_dist_all]

_BACKEND_COMPILE = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT = "/jax/compilation_cache/cache_hits"
_STATE: dict[str, object] = {"path": None, "readonly": False}
for _name in ("xla_compiles", "persistent_cache_hits"):
    metrics._COUNTS.setdefault(_name, 0)


class CacheWarning(UserWarning):
    """The persistent cache directory is unusable; compilation continues uncached."""


def _on_duration(event: str, duration: float, **_: object) -> None:
    if event == _BACKEND_COMPILE:  # NOTE: JAX records this also when the executable came from disk
        metrics._COUNTS["xla_compiles"] += 1


def _on_event(event: str, **_: object) -> None:
    if event == _CACHE_HIT:
        metrics._COUNTS["persistent_cache_hits"] += 1
        metrics._COUNTS["xla_compiles"] -= 1  # the backend_compile event that follows was a load


monitoring.register_event_duration_secs_listener(_on_duration)
monitoring.register_event_listener(_on_event)


def _usable(path: str, readonly: bool) -> str | None:
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path!r} exists and is not a directory"
    if readonly:
        if not os.path.isdir(path) or not os.access(path, os.R_OK | os.X_OK):
            return f"{path!r} is not a readable directory"
        return None
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".probe"):
            pass
    except OSError as e:
        return f"{path!r} is not writable ({e.strerror or e}); pass readonly=True to only read it"
    return None


def initialize_cache(path: str | os.PathLike, readonly: bool = False) -> bool:
    """Use ``path`` as the persistent compilation cache; ``readonly``: load, never write.

    Returns ``True`` when the cache is active. An unusable directory gives a
    :class:`CacheWarning` and returns ``False``: programs still compile, uncached.

    Example:
        >>> initialize_cache("/proc/no-such-dir/cache")  # doctest: +SKIP
        False
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"cache path must be a str or os.PathLike, got {type(path).__name__}: {path!r}")
    path = os.path.abspath(os.fspath(path))
    problem = _usable(path, readonly)
    if problem is not None:
        warnings.warn(CacheWarning(f"persistent compilation cache disabled: {problem}"), stacklevel=2)
        return False
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    # NOTE: readonly = never large enough to write; -1 = write every entry, no size override
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 2**62 if readonly else -1)
    try:  # JAX decides once per process whether the cache is used; make it look again
        from jax._src import compilation_cache
        compilation_cache.reset_cache()
    except (ImportError, AttributeError):  # pragma: no cover - older/newer jax
        pass
    _STATE.update(path=path, readonly=readonly)
    return True


def cache_path() -> str | None:
    """The active persistent cache directory, or ``None``."""
    return _STATE["path"]  # type: ignore[return-value]


def device_count() -> int:
    """Number of JAX devices the SPMD programs run on."""
    return jax.device_count()
