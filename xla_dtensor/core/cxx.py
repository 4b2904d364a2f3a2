"""The core's C++ part (``core/_maker.cpp``), built against the installed torch and cached.

It links against torch's C++ libraries, so unlike ``_native.c`` it cannot be built by
``pip install`` (torch is not in pip's build environment) and must match the torch it runs
with. :func:`load` builds it once per torch version, Python and source (about 15 s with
``g++``; ``python3 dev.py setup`` does it), caches it under ``$XLA_DTENSOR_CACHE_DIR`` or
``~/.cache/xla_dtensor``, and imports it. Without a compiler the core makes its tensors
with ``torch.Tensor._make_wrapper_subclass`` instead (~1 us more per recorded op) and
says so once; ``XLA_DTENSOR_CXX=0`` chooses that without a warning.

Example:
    >>> from xla_dtensor.core import cxx
    >>> cxx.MODULE is not None or bool(cxx.REASON)
    True
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("_maker.cpp")
NAME = "_maker"


def cache_dir() -> Path:
    """Where built modules are kept: ``$XLA_DTENSOR_CACHE_DIR``, else ``~/.cache/xla_dtensor``."""
    env = os.environ.get("XLA_DTENSOR_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "xla_dtensor"


def target() -> Path:
    """The module's path for this torch, Python, platform and source."""
    import torch
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    tag = f"torch{torch.__version__}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}-abi{abi}-{digest}"
    return cache_dir() / f"{NAME}-{tag.replace('+', '_')}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def _command(out: Path) -> list[str]:
    import torch
    from torch.utils import cpp_extension
    lib = Path(torch.__file__).parent / "lib"
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    return [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in includes), str(SOURCE), "-o", str(out),
            f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]


def build(quiet: bool = False) -> Path:
    """Compile the module for this torch unless it is cached; its path. Raises on a failed build.

    Several processes may call this at once: one compiles under a file lock, the others wait
    for it and reuse the result.
    """
    out = target()
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    import fcntl
    with open(out.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return out
        if not quiet:
            print(f"xla_dtensor: compiling {SOURCE.name} for this torch (once, ~15 s) into {out.parent}",
                  file=sys.stderr, flush=True)
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            done = subprocess.run(_command(Path(tmp)), capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"compiling {SOURCE.name} failed (exit {done.returncode}):\n"
                                   f"{(done.stderr or done.stdout)[-2000:]}")
            os.replace(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return out


def _load() -> tuple[ModuleType | None, str]:
    if os.environ.get("XLA_DTENSOR_CXX", "1") == "0":
        return None, "XLA_DTENSOR_CXX=0"
    try:
        path = build()
        spec = importlib.util.spec_from_file_location(f"xla_dtensor.core.{NAME}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module, ""
    except (OSError, RuntimeError, ImportError) as error:
        reason = f"the C++ tensor maker is not available ({str(error).splitlines()[0]})"
        warnings.warn(f"{reason}: lazy tensors are made by torch.Tensor._make_wrapper_subclass, ~1 us more per "
                      "recorded op. It needs g++ and Python's headers; XLA_DTENSOR_CXX=0 chooses this "
                      "without the warning.", RuntimeWarning, stacklevel=2)
        return None, reason


MODULE, REASON = _load()

