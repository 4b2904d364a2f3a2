"""Atomic publication of a checkpoint directory: write a hidden sibling, then rename it into place.

A save writes everything into ``.NAME.tmp-HOST-PID-RANDOM`` next to the target and
writes the manifest last. Publishing is one ``rename`` when the target does not exist.
Over an existing checkpoint it is one atomic exchange (Linux ``renameat2`` with
``RENAME_EXCHANGE``) where the file system supports it, else two renames (old aside,
new in); a crash between those two leaves no target, and :func:`leftovers` names what
is there. A reader therefore sees the old checkpoint, the new one, or none: never a mix.

Example:
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp(); final = os.path.join(root, "ckpt")
    >>> tmp = staging_dir(final); os.makedirs(tmp)
    >>> publish(tmp, final); os.path.isdir(final), os.path.exists(tmp)
    (True, False)
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import uuid

from xla_dtensor.checkpoint.errors import CheckpointError

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_CHECKPOINT_FILES = (".xdt_manifest.json", ".metadata")


def staging_dir(final: str) -> str:
    """A fresh hidden sibling of ``final`` for one save (host and pid in its name)."""
    parent, name = os.path.split(os.path.abspath(final))
    return os.path.join(parent, f".{name}.tmp-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}")


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: str, b: str) -> bool:
    """Swap ``a`` and ``b`` atomically; False where the platform or file system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.renameat2
    except (OSError, AttributeError):
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, f"renameat2({a!r}, {b!r}): {os.strerror(err)}")


def check_replaceable(final: str) -> None:
    """Refuse to replace ``final`` unless it is absent, empty or a checkpoint directory."""
    if not os.path.lexists(final):
        return
    if not os.path.isdir(final) or os.path.islink(final):
        raise CheckpointError(f"{final!r} exists and is not a directory; refusing to replace it with a checkpoint")
    names = os.listdir(final)
    if names and not any(n in names for n in _CHECKPOINT_FILES):
        raise CheckpointError(f"{final!r} is a non-empty directory that is not a checkpoint "
                              f"(no {' or '.join(_CHECKPOINT_FILES)}); refusing to replace it")


def publish(tmp: str, final: str, *, exchange: bool = True) -> None:
    """Make the complete directory ``tmp`` appear as ``final`` (see the module doc)."""
    parent = os.path.dirname(os.path.abspath(final))
    _fsync_dir(tmp)
    check_replaceable(final)
    if not os.path.lexists(final):
        os.rename(tmp, final)
    elif exchange and _exchange(tmp, final):
        shutil.rmtree(tmp, ignore_errors=True)  # now holds the old checkpoint
    else:
        old = tmp.replace(".tmp-", ".old-", 1)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    _fsync_dir(parent)


def leftovers(final: str) -> list[str]:
    """Hidden siblings an interrupted save of ``final`` left behind (old copies, partial saves)."""
    parent, name = os.path.split(os.path.abspath(final))
    try:
        names = os.listdir(parent)
    except OSError:
        return []
    return sorted(os.path.join(parent, n) for n in names
                  if n.startswith(f".{name}.tmp-") or n.startswith(f".{name}.old-"))


def remove_dead_leftovers(final: str) -> None:
    """Delete partial saves of ``final`` by processes of this host that are no longer running."""
    host = socket.gethostname()
    for path in leftovers(final):
        tag = os.path.basename(path).split(".tmp-", 1)[-1] if ".tmp-" in path else None
        if tag is None or not tag.startswith(host + "-"):
            continue
        try:
            pid = int(tag[len(host) + 1:].split("-", 1)[0])
        except ValueError:
            continue
        if pid != os.getpid() and not _alive(pid):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
