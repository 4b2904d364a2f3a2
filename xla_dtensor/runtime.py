"""Runtime services: the persistent compilation cache, XLA compile counters, and (re-exported
from :mod:`xla_dtensor.runtime_dist`) device counts, ``use_spmd`` and multi-process start.

``initialize_cache(path)`` turns on JAX's persistent compilation cache in ``path``
with no size or compile-time threshold, so every executable (also the small ones of
tests and eager ops) is written, and a later process loads it instead of running XLA.
The counters ``xla_compiles`` (XLA backend compilations actually run) and
``persistent_cache_hits`` (executables loaded from disk) are kept in
``xla_dtensor.metrics`` from JAX's monitoring events.

Every entry carries a fingerprint of the program it belongs to: its cache key (JAX's
hash of the lowered module, whose argument types and shardings are the input signature,
plus the compile options, devices and backend) and a SHA-256 over key and executable.
An entry is checked before it is deserialized: one copied from another program's file,
altered, or written without a fingerprint gives a :class:`CacheWarning`, counts in
``persistent_cache_rejected`` and is recompiled (and rewritten), never run.

Example:
    >>> import tempfile, xla_dtensor
    >>> xla_dtensor.runtime.initialize_cache(tempfile.mkdtemp())
    True
"""
from __future__ import annotations

import hashlib
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
_MAGIC = b"XDTC1\n"
for _name in ("xla_compiles", "persistent_cache_hits", "persistent_cache_rejected"):
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


def _fingerprint(key: str, payload: bytes) -> bytes:
    return hashlib.sha256(len(key).to_bytes(4, "big") + key.encode() + payload).digest()


def seal_entry(key: str, payload: bytes) -> bytes:
    """``payload`` (JAX's cache entry) prefixed with its key and fingerprint."""
    k = key.encode()
    return _MAGIC + len(k).to_bytes(4, "big") + k + _fingerprint(key, payload) + payload


def open_entry(key: str, entry: bytes) -> tuple[bytes | None, str]:
    """The payload of ``entry`` if it was sealed for ``key`` and is intact, else ``(None, why)``."""
    if not entry.startswith(_MAGIC):
        return None, "it has no program fingerprint (written by another tool or version, or altered)"
    at = len(_MAGIC)
    n = int.from_bytes(entry[at:at + 4], "big")
    stored, digest, payload = entry[at + 4:at + 4 + n], entry[at + 4 + n:at + 36 + n], entry[at + 36 + n:]
    if stored != key.encode():
        return None, f"it belongs to another program (key {stored[:64].decode(errors='replace')!r})"
    if digest != _fingerprint(key, payload):
        return None, "its fingerprint does not match its bytes (altered or truncated)"
    return payload, ""


class _Fingerprinted:
    """A JAX cache (``CacheInterface``) whose entries are sealed on put and checked on get."""

    def __init__(self, base: object) -> None:
        self._base = base
        self._refused: set[str] = set()

    @property
    def _path(self):  # noqa: ANN202 - JAX reads it for logging
        return self._base._path

    def get(self, key: str) -> bytes | None:
        entry = self._base.get(key)
        if entry is None:
            return None
        payload, why = open_entry(key, entry)
        if payload is None:
            self._refused.add(key)
            metrics._COUNTS["persistent_cache_rejected"] += 1
            warnings.warn(CacheWarning(f"persistent compilation cache entry {key} not used: {why}; "
                                       f"recompiling"), stacklevel=2)
        return payload

    def put(self, key: str, value: bytes) -> None:
        entry = seal_entry(key, value)
        folder = getattr(self._base, "path", None)
        if key not in self._refused or folder is None:
            self._base.put(key, entry)  # NOTE: JAX's file cache never replaces an existing entry
            return
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key[:40]}.")  # the refused entry, replaced atomically
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(entry)
            os.replace(tmp, os.path.join(folder, f"{key}-cache"))
            self._refused.discard(key)
        except OSError:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def clear(self) -> None:
        self._base.clear()


def _install_fingerprints() -> None:
    """Make JAX's file cache a :class:`_Fingerprinted` one (once per process)."""
    from jax._src import compilation_cache
    if getattr(compilation_cache.get_file_cache, "_xdt_sealed", False):
        return
    plain = compilation_cache.get_file_cache

    def get_file_cache(path: str):  # noqa: ANN202
        got = plain(path)
        return None if got is None else (_Fingerprinted(got[0]), got[1])

    get_file_cache._xdt_sealed = True  # type: ignore[attr-defined]
    compilation_cache.get_file_cache = get_file_cache


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
        _install_fingerprints()
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
