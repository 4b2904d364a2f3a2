"""The core's C++ part (``core/_cxx.cpp``), built against the installed torch and cached.

In it: the tensor maker the recorder makes its outputs with; a kernel at torch's Python dispatch
key for the :data:`HOT_OPS`, which takes their calls on lazy tensors straight to the core's C entry
instead of through torch's generic Python fallback (~1.2 us an op less); ``F.linear``'s and the fused
attention's autograd nodes; and the device's guard, which torch asks for each output's stream
(torch's Python-backend guard answered each ask through Python: ~6 us of a view's 12.6 with autograd).

It links against torch's C++ libraries, so unlike ``_native.c`` it cannot be built by
``pip install`` (torch is not in pip's build environment) and must match the torch it runs
with. :func:`load` builds it once per torch version, Python and source (about 15 s with
``g++``; ``python3 dev.py setup`` does it), keeps it under ``$XLA_DTENSOR_BUILD_DIR`` or
``~/.cache/xla_dtensor/build`` (a build, not data: the test suite's temporary
``XLA_DTENSOR_CACHE_DIR`` leaves it where setup put it), and imports it. Without a compiler the core makes its tensors
with ``torch.Tensor._make_wrapper_subclass`` and its ops take torch's fallback instead
(2-3 us more per recorded op), and says so once; ``XLA_DTENSOR_CXX=0`` chooses that without a
warning.

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

SOURCE = Path(__file__).with_name("_cxx.cpp")
NAME = "_cxx"

# The ops whose calls the kernel at the Python key takes (those of them whose argument and result types
# it converts: ``_cxx.install`` returns which): the views, elementwise and fused ops of a transformer's
# step, with their backward ops. The rest go through torch's Python fallback, which ends in the same entry.
HOT_OPS = tuple(f"aten::{name}" for name in (
    "detach", "alias", "view", "_unsafe_view", "transpose.int", "t", "permute", "expand", "unsqueeze",
    "squeeze.dim", "squeeze.dims", "slice.Tensor", "select.int", "split.Tensor", "split_with_sizes",
    "unbind.int", "as_strided", "clone", "_to_copy", "copy_", "add.Tensor", "add_.Tensor", "sub.Tensor",
    "mul.Tensor", "mul.Scalar", "mul_.Tensor", "mul_.Scalar", "div.Tensor", "div.Scalar", "neg", "exp",
    "log", "sqrt", "rsqrt", "pow.Tensor_Scalar", "tanh", "sigmoid", "relu", "gelu", "gelu_backward", "silu",
    "silu_backward", "threshold_backward", "tanh_backward", "sigmoid_backward", "native_layer_norm",
    "native_layer_norm_backward", "embedding", "embedding_dense_backward", "mm", "bmm", "addmm", "_softmax",
    "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data", "nll_loss_forward",
    "nll_loss_backward", "sum.dim_IntList", "sum.default", "mean.dim", "ones_like", "zeros_like", "empty_like",
    "fill_.Scalar", "zero_", "cat", "stack", "where.self", "masked_fill.Scalar"))


def build_dir() -> Path:
    """Where built modules are kept: ``$XLA_DTENSOR_BUILD_DIR``, else ``~/.cache/xla_dtensor/build``."""
    env = os.environ.get("XLA_DTENSOR_BUILD_DIR")
    return Path(env) if env else Path.home() / ".cache" / "xla_dtensor" / "build"


def _stem() -> str:
    """The module's file name up to its source's digest: this torch, Python, platform and C++ ABI."""
    import torch
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    tag = f"torch{torch.__version__}-{sys.implementation.cache_tag}-{sysconfig.get_platform()}-abi{abi}"
    return f"{NAME}-{tag.replace('+', '_')}"


_SUFFIX = sysconfig.get_config_var("EXT_SUFFIX") or ".so"


def target() -> Path:
    """The module's path for this torch, Python, platform and source."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    return build_dir() / f"{_stem()}-{digest}{_SUFFIX}"


def command(out: Path, source: Path = SOURCE) -> list[str]:
    """The compiler's command line building ``source`` (a C++ file using torch's headers and the Python C API) into
    the extension module ``out`` for the installed torch and this Python."""
    import torch
    from torch.utils import cpp_extension
    lib = Path(torch.__file__).parent / "lib"
    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    return [os.environ.get("CXX", "g++"), "-O2", "-std=c++17", "-shared", "-fPIC", "-w",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in includes), str(source), "-o", str(out),
            f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10", "-ltorch_cpu", "-ltorch", "-ltorch_python"]


def compile_to(out: Path, source: Path = SOURCE) -> None:
    """Compile ``source`` into the module ``out`` (:func:`command`) through a temporary file beside it, so ``out`` is
    whole or absent. Raises ``RuntimeError`` with the compiler's exit status and first error line."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
    os.close(fd)
    try:
        done = subprocess.run(command(Path(tmp), source), capture_output=True, text=True)
        if done.returncode != 0:
            errors = [line for line in (done.stderr or done.stdout).splitlines() if "error" in line]
            raise RuntimeError(f"compiling {source.name} failed (exit {done.returncode})"
                               + (f": {errors[0].strip()}" if errors else ""))
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
        compile_to(out)
        _prune(out)
    return out


def _prune(out: Path, age_s: float = 3600.0) -> None:
    """Remove this torch's and Python's builds of other sources than ``out``'s, made over ``age_s`` before
    it (a checkout of an older source rebuilds; one in use beside this one keeps its build)."""
    for old in out.parent.glob(f"{_stem()}-*{_SUFFIX}"):
        if old != out and old.stat().st_mtime < out.stat().st_mtime - age_s:
            old.unlink(missing_ok=True)


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
        reason = f"the core's C++ part is not available ({str(error).splitlines()[0]})"
        warnings.warn(f"{reason}: lazy tensors are made by torch.Tensor._make_wrapper_subclass and their ops take "
                      "torch's Python fallback, 2-3 us more per recorded op. It needs g++ and Python's headers; "
                      "XLA_DTENSOR_CXX=0 chooses this without the warning.", RuntimeWarning, stacklevel=2)
        return None, reason


MODULE, REASON = _load()
TAKEN: tuple[str, ...] = ()  # the HOT_OPS the kernel at the Python key takes (set by :func:`install`)


def install(cls: type, entry: object) -> tuple[str, ...]:
    """Put the kernel at the Python key for :data:`HOT_OPS`, calling ``entry(cls, func, types, args, kwargs)``
    (``cls.__torch_dispatch__``'s function) for their calls on ``cls`` tensors; the ops it took."""
    global TAKEN
    if MODULE is None:
        raise RuntimeError(REASON)
    TAKEN = tuple(MODULE.install(cls, entry, list(HOT_OPS)))
    return TAKEN


def own_class(cls: type) -> None:
    """Let the kernel take calls on ``cls`` tensors too (a subclass whose ``__torch_dispatch__`` is the same
    entry and whose ops make tensors of its own class: ``XLAShardedTensor``); without the module, nothing."""
    if MODULE is not None:
        MODULE.own_class(cls)

