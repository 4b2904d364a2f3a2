"""Execution analysis: why each compile and execution happened, and recompile warnings.

With ``XLA_DTENSOR_DEBUG=1`` (or :func:`set_debug`) every compile and execution prints
one line to stderr: the kind, the cause (user sync, ``.item()``, print, ``compile``
call, eager op), the graph hash, the number of program inputs and outputs, the user
frame that triggered it and, for a recompile at the same call site, which input
changed. Independently of the switch, a call site that compiles more than
``config.recompile_warn_limit`` different programs gets a :class:`RecompileWarning`.

Example:
    >>> from xla_dtensor.debug import analysis
    >>> analysis.set_debug(False)
"""
from __future__ import annotations

import os
import sys
import warnings
from typing import Any

from xla_dtensor.config import config
from xla_dtensor.core.state import STATE

__all__ = ["RecompileWarning", "set_debug", "event", "install", "user_frame"]

STATE.debugging = os.environ.get("XLA_DTENSOR_DEBUG", "") not in ("", "0")
_SITE_COMPILES: dict[str, int] = {}
_SITE_LAST: dict[str, tuple] = {}
_WARNED: set[str] = set()
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SKIP = (_PKG, os.path.dirname(os.path.abspath(warnings.__file__)))


class RecompileWarning(UserWarning):
    """One call site keeps compiling new programs (shapes or Python values change)."""


def set_debug(on: bool = True) -> None:
    """Turn the per-compile/per-execution lines on or off (``XLA_DTENSOR_DEBUG`` sets the default)."""
    STATE.debugging = bool(on)


def user_frame() -> str:
    """``file:line in function`` of the innermost frame outside xla_dtensor, torch and jax."""
    f = sys._getframe(1)
    while f is not None:
        fn = f.f_code.co_filename
        if not (fn.startswith(_PKG) or "/torch/" in fn or "/jax/" in fn or "/jaxlib/" in fn or fn.startswith("<")):
            return f"{fn}:{f.f_lineno} in {f.f_code.co_name}"
        f = f.f_back
    return "<unknown>"


_CAUSES = (("_item", ".item()"), ("__repr__", "print/repr"), ("__format__", "print/format"),
           ("tolist", ".tolist()"), ("numpy", ".numpy()"), ("__array__", "numpy conversion"),
           ("run_on_cpu", "CPU fallback of an op without lowering"), ("compute_now", "eager op"),
           ("sync", "user sync (xla_dtensor.sync/mark_step)"), ("to_cpu", ".cpu()/host transfer"))


def lazy_cause() -> str:
    """The barrier that triggered the current lazy execution, from the call stack."""
    names = []
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_filename.startswith(_PKG):
            names.append(f.f_code.co_name)
        f = f.f_back
    for fname, cause in _CAUSES:
        if fname in names:
            return cause
    return "materialization"


def event(kind: str, cause: str, graph_hash: int, n_in: int, n_out: int, *, site: str | None = None,
          detail: str = "", force: bool = False, count: bool = False, seconds: float | None = None) -> None:
    """Report one compile/trace/execution; ``count``: it built a new executable (recompile tracking)."""
    if count and site is not None:
        n = _SITE_COMPILES[site] = _SITE_COMPILES.get(site, 0) + 1
        limit = config.recompile_warn_limit
        if limit and n > limit and site not in _WARNED:
            _WARNED.add(site)
            warnings.warn(RecompileWarning(
                f"{site} has compiled {n} different programs (limit config.recompile_warn_limit={limit}); "
                f"input shapes or Python values keep changing. Last change: {detail or cause}"), stacklevel=2)
    if not STATE.debugging:
        return
    where = user_frame()
    took = f" ({seconds * 1e3:.1f} ms)" if seconds is not None else ""
    extra = f"; {detail}" if detail else ""
    print(f"[xla_dtensor] {kind}: cause={cause} graph={graph_hash & 0xffffffff:08x} inputs={n_in} "
          f"outputs={n_out} at {where}{took}{extra}", file=sys.stderr, flush=True)


def _describe_leaves(leaves: list) -> list[str]:
    out = []
    for n in leaves:
        k = n.key
        if k[0] == "param":
            out.append(f"Python {k[1].__name__} scalar")
        else:
            dt = str(k[2]).replace("torch.", "")
            out.append(f"{dt}{list(k[1])}" + (f" sharded {k[3]}" if len(k) > 3 and k[3] is not None
                                              and not _single(k[3]) else ""))
    return out


def _single(sharding: Any) -> bool:
    return len(getattr(sharding, "device_set", ())) <= 1


def explain_lazy(roots: list, compiled: bool, seconds: float) -> None:
    """Report a lazy execution (called by the instrumented executor)."""
    from xla_dtensor.core import executor
    plan = executor.make_plan(roots)
    struct, leaves, outs = plan.struct, plan.leaves, plan.outs
    site = user_frame()
    detail = ""
    descs = _describe_leaves(leaves)
    ops = [(str(n.op), n.key) for n in plan.order if n.fn is not None]
    last = _SITE_LAST.get(site)
    if compiled and last is not None:
        detail = "recompile: " + _diff(last, descs, ops)
    if compiled:
        _SITE_LAST[site] = (descs, ops, struct)
    cause = lazy_cause()
    event("compile" if compiled else "execute", cause, hash(struct), len(leaves), len(outs),
          site=site, detail=detail, count=compiled and cause != "eager op", seconds=seconds)


def _diff(last: tuple, descs: list[str], ops: list) -> str:
    old_descs, old_ops, _ = last
    if len(old_descs) != len(descs):
        return f"number of inputs {len(old_descs)} -> {len(descs)}"
    for i, (a, b) in enumerate(zip(old_descs, descs)):
        if a != b:
            return f"input {i} changed: {a} -> {b}"
    if len(old_ops) != len(ops):
        return f"graph size {len(old_ops)} -> {len(ops)} nodes (same inputs)"
    for i, (a, b) in enumerate(zip(old_ops, ops)):
        if a != b:
            if a[0] != b[0]:
                return f"graph differs at op {i}: {a[0]} -> {b[0]} (same inputs)"
            return f"op {i} ({b[0]}) has new arguments: {_short(a[1])} -> {_short(b[1])}"
    return "different outputs or donation (same graph)"


def _short(key: object, limit: int = 160) -> str:
    text = repr(key[1] if isinstance(key, tuple) and len(key) == 2 else key)
    return text if len(text) <= limit else text[:limit] + "..."


def _on_execute(roots: list, compiled: bool, seconds: float) -> None:
    from xla_dtensor.debug import metrics_report as timing
    timing.record("compile" if compiled else "execute", seconds)
    if compiled or STATE.debugging:
        explain_lazy(roots, compiled, seconds)


def install() -> None:
    """Time every lazy execution and explain compiles (an executor hook; idempotent)."""
    from xla_dtensor.core import executor
    if _on_execute not in executor.ON_EXECUTE:
        executor.ON_EXECUTE.append(_on_execute)
