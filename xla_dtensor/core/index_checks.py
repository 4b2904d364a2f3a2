"""Bounds checks on index tensors (``xla_dtensor.config.check_indices``).

XLA never faults on an out-of-range index: gathers clamp it, scatters drop it, and
negative indices wrap. torch CPU raises. With the checks on, each indexing op
(``embedding``, ``x[idx]``, ``index_select``, ``gather``, ``take``, ``index_put``,
``scatter*``, ``index_add/copy/fill``, ``nll_loss``) also records a small check node
(whether any index is out of range, and the first such index). The next barrier
(``sync()``, ``.item()``, ``.cpu()``) computes the checks with its program. A host read
(``.item()``, ``.cpu()``), ``wait()`` and ``sync(wait=True)`` then read them (one small
transfer) and raise torch's exception type naming the op, the offending index and the
user's source line; a plain ``sync()`` reads them at the next barrier after it, once
it has launched its own program, so tracing the next step still overlaps running this
one. The values the step computed are kept (with the clamped reads).

Default (``check_indices = True``): on in lazy and eager mode; ``None``: eager mode
only; ``False``: off. Inside ``xla_dtensor.compile`` indices are not checked (a replay
runs no Python).

Example:
    >>> import torch, xla_dtensor
    >>> x = torch.arange(10.0, device=xla_dtensor.device())[torch.tensor([15])]
    >>> xla_dtensor.sync()  # doctest: +SKIP
    Traceback (most recent call last):
    IndexError: index 15 is out of bounds for dimension 0 with size 10 (aten.index.Tensor at ...)
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.config import config
from xla_dtensor.core.dispatch import SPECIAL, record
from xla_dtensor.core.ir import Node, make_node
from xla_dtensor.core import threads as _threads
from xla_dtensor.core.source import user_frame
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, value_of

aten = torch.ops.aten


class Check(NamedTuple):
    """One recorded bounds check: its node (int64[2]: any bad, first bad index) and how to report it."""

    node: Node
    op: Any
    dim: int
    size: int
    error: type[Exception]
    message: str  # format fields: index, dim, size
    where: str
    owner: int = 0  # the thread whose barrier reports it (core.threads)


PENDING: list[Check] = []  # recorded, not yet computed
LAUNCHED: list[tuple[int | None, list[Check], list[Any]]] = []  # (owner, checks, arrays): computed by a launched program, not yet read


def active() -> bool:
    """Whether ops are checked now: ``config.check_indices``, or by default in eager mode."""
    if STATE.capturing:
        return False  # xla_dtensor.compile records the function: a replay runs no Python to check with
    mode = config.check_indices
    if mode is None:
        return STATE.runs_at_once()  # eager mode, and not tracing for xla_dtensor.compile
    return bool(mode)


_FNS: dict[tuple, Callable[..., Any]] = {}


def _check_fn(size: int, negative: bool, ignore: int | None) -> Callable[..., Any]:
    key = (size, negative, ignore)
    fn = _FNS.get(key)
    if fn is None:
        def fn(idx: Any) -> Any:
            i = idx.reshape(-1).astype(jnp.int64)
            bad = (i < (-size if negative else 0)) | (i >= size)
            if ignore is not None:
                bad = bad & (i != ignore)
            if i.size == 0:
                return jnp.zeros((2,), jnp.int64)
            return jnp.stack([jnp.any(bad).astype(jnp.int64), i[jnp.argmax(bad)]])
        _FNS[key] = fn
    return fn


def _add(op: Any, index: Any, dim: int, size: int, error: type[Exception], message: str, *,
         negative: bool = False, ignore: int | None = None) -> None:
    if not isinstance(index, LazyTensor) or index.dtype in (torch.bool, torch.uint8) or index.is_floating_point():
        return
    key = ("check_indices", size, negative, ignore)
    node = make_node("check_indices", key, hash(key), (value_of(index),), _check_fn(size, negative, ignore))
    PENDING.append(Check(node, op, dim, size, error, message, user_frame(), STATE.owner))


_BOUNDS = "index {index} is out of bounds for dimension {dim} with size {size}"
_SELF = "index out of range in self (index {index} for dimension {dim} with size {size})"


def _arg(args: tuple, kwargs: dict, pos: int, name: str, default: Any = None) -> Any:
    return args[pos] if len(args) > pos else kwargs.get(name, default)


def _size(x: torch.Tensor, dim: int) -> tuple[int, int]:
    if x.dim() == 0:
        return 0, 1
    d = dim % x.dim()
    return d, x.shape[d]


def _advanced(op: Any, args: tuple, kwargs: dict) -> None:
    """``x[i0, i1, ...]`` / ``index_put``: each integer index against its own dim; negatives allowed."""
    x, indices = args[0], _arg(args, kwargs, 1, "indices")
    dim = 0
    for idx in indices:
        if idx is None:
            dim += 1
        elif idx.dtype in (torch.bool, torch.uint8):
            dim += idx.dim()
        else:
            if dim < x.dim():
                _add(op, idx, dim, x.shape[dim], IndexError, _BOUNDS, negative=True)
            dim += 1


def _on_dim(error: type[Exception], message: str, index_pos: int, *, negative: bool = False) -> Callable[..., None]:
    """Ops ``op(self, dim, index, ...)``: ``index`` against ``self.shape[dim]``."""
    def check(op: Any, args: tuple, kwargs: dict) -> None:
        d, n = _size(args[0], _arg(args, kwargs, 1, "dim"))
        _add(op, _arg(args, kwargs, index_pos, "index"), d, n, error, message, negative=negative)
    return check


def _embedding(op: Any, args: tuple, kwargs: dict) -> None:
    w = args[0]
    _add(op, _arg(args, kwargs, 1, "indices"), 0, w.shape[0], IndexError, _SELF)


def _take(op: Any, args: tuple, kwargs: dict) -> None:
    _add(op, _arg(args, kwargs, 1, "index"), 0, args[0].numel(), IndexError,
         "out of range: tried to access index {index} on a tensor of {size} elements.", negative=True)


def _nll(classes_dim: int) -> Callable[..., None]:
    def check(op: Any, args: tuple, kwargs: dict) -> None:
        x = args[0]
        d = classes_dim if x.dim() > 1 else 0
        _add(op, _arg(args, kwargs, 1, "target"), d, x.shape[d], IndexError, "Target {index} is out of bounds.",
             ignore=_arg(args, kwargs, 4, "ignore_index", -100))
    return check


_RULES: dict[str, Callable[..., None]] = {
    "embedding": _embedding,
    "index": _advanced, "index_put": _advanced, "index_put_": _advanced, "_index_put_impl_": _advanced,
    "gather": _on_dim(RuntimeError, _BOUNDS, 2),
    "scatter": _on_dim(RuntimeError, _BOUNDS, 2), "scatter_": _on_dim(RuntimeError, _BOUNDS, 2),
    "scatter_add": _on_dim(RuntimeError, _BOUNDS, 2), "scatter_add_": _on_dim(RuntimeError, _BOUNDS, 2),
    "scatter_reduce": _on_dim(RuntimeError, _BOUNDS, 2), "scatter_reduce_": _on_dim(RuntimeError, _BOUNDS, 2),
    "index_select": _on_dim(IndexError, _SELF, 2),
    "index_add": _on_dim(IndexError, _SELF, 2), "index_add_": _on_dim(IndexError, _SELF, 2),
    "index_copy": _on_dim(IndexError, _BOUNDS, 2), "index_copy_": _on_dim(IndexError, _BOUNDS, 2),
    "index_fill": _on_dim(IndexError, _BOUNDS, 2, negative=True),
    "index_fill_": _on_dim(IndexError, _BOUNDS, 2, negative=True),
    "take": _take,
    "nll_loss_forward": _nll(1), "nll_loss2d_forward": _nll(1),
}


def _checked(rule: Callable[..., None], then: Callable[..., Any]) -> Callable[..., Any]:
    def handler(op: Any, args: tuple, kwargs: dict) -> Any:
        out = then(op, args, kwargs)  # first: torch's own shape errors are raised at the op
        if active():
            rule(op, args, kwargs)
        return out
    return handler


def install() -> None:
    """Put the checks in front of each indexing op's dispatch (``SPECIAL``). Idempotent."""
    for name, rule in _RULES.items():
        packet = getattr(aten, name)
        for ov in packet.overloads():
            if ov.endswith("out"):
                continue
            op = getattr(packet, ov)
            prev = SPECIAL.get(op)
            if getattr(prev, "_index_check", False):
                continue
            handler = _checked(rule, prev or record)
            handler._index_check = True  # type: ignore[attr-defined]
            SPECIAL[op] = handler


def _owner(c: Check) -> int:
    return c.owner


def _first(entry: tuple) -> Any:
    return entry[0]


def _stack(*checks: Any) -> Any:
    return jnp.stack(checks)


def take(owner: int | None = None) -> tuple[list[Check], list[Node]]:
    """The pending checks (removed), and the one node computing them all ([] if none).

    ``owner``: only that thread's checks (and those of no thread or a finished one); ``None``: all.
    Checks whose inputs a compiled replay consumed are dropped with a warning (:func:`runnable`).
    The caller adds the node to its program; its value (int64[k, 2]) goes to :func:`verify`.
    """
    if not PENDING:
        return [], []
    mine, others = _threads.split(PENDING, _owner, owner)
    checks = runnable(mine)
    PENDING[:] = others
    if not checks:
        return [], []
    key = ("check_indices", len(checks))
    return checks, [make_node("check_indices", key, hash(key), tuple(c.node for c in checks), _stack)]


def launched(checks: list[Check], arrays: list[Any], owner: int | None = None) -> None:
    """Remember checks a launched program computes, to read at ``owner``'s next barrier."""
    if checks:
        with _threads.LOCK:  # NOTE: callers are outside the lock; verify_launched rewrites the list
            LAUNCHED.append((owner, checks, arrays))


def verify_launched(owner: int | None = None) -> None:
    """Read the checks of programs launched earlier (by ``owner``, by no thread or by a finished
    one; ``None``: all); raise for the first that failed (each read once).

    The list is edited under the core's lock; the reads (a wait for the device) run outside it.
    """
    with _threads.LOCK:
        mine, LAUNCHED[:] = _threads.split(LAUNCHED, _first, owner)
        if not mine:
            return
    for k, (_, checks, arrays) in enumerate(mine):
        try:
            verify(checks, arrays)
        except Exception:
            with _threads.LOCK:
                LAUNCHED[:0] = mine[k + 1:]  # the rest stay for the next barrier
            raise


def verify(checks: list[Check], arrays: list[Any]) -> None:
    """Raise torch's error for the first failed check (``arrays``: the value of :func:`take`'s node)."""
    if not checks:
        return
    for c, (bad, index) in zip(checks, np.asarray(arrays[0])):  # NOTE: ~20 us less than jax.device_get
        if bad:
            text = c.message.format(index=int(index), dim=c.dim, size=c.size)
            raise c.error(f"{text} ({c.op} at {c.where}; found by xla_dtensor.config.check_indices)")


def runnable(checks: list[Check]) -> list[Check]:
    """``checks`` whose inputs still exist (a compiled replay may have donated a traced leaf's buffer)."""
    from xla_dtensor.core.ir import topo_order
    from xla_dtensor.core.packs import array_of
    keep = []
    for c in checks:
        leaves = [n for n in topo_order([c.node]) if n.fn is None]
        if any(getattr(array_of(n), "is_deleted", lambda: False)() for n in leaves):
            warnings.warn(f"check_indices: {c.op} at {c.where} was not checked (its inputs were consumed by a "
                          "compiled program)", stacklevel=3)
            continue
        keep.append(c)
    return keep
