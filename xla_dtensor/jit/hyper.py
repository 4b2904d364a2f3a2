"""Optimizer hyperparameters as inputs of a compiled program (learning-rate schedules replay).

A scheduler changes ``param_group["lr"]`` (and OneCycleLR the momentum or ``betas``) every
step. Were those values constants of the program, every step would trace and compile anew
(float lr), or a replay would run with the traced value (a CPU-tensor lr, read on the host
by torch). Instead, while a call is traced, every float hyperparameter of the optimizers
among the arguments (a float, a float in a tuple such as ``betas``, a 0-d CPU tensor) is
swapped for a :class:`Sym`: a float that remembers how it was computed from the
hyperparameters (``1 - lr * weight_decay``). A torch function mode (:class:`Watch`) sees
each Sym an op receives and the scalar-parameter leaf (``PARAM``) the lazy core made of it;
that leaf becomes a program input, which a replay computes from the current values.

What the replay checks (a mismatch traces a new program for the call):

* guards: every comparison made on a Sym while tracing (``if weight_decay != 0``) and
  every Sym that an op received as 0 or 1 (the core compiles those as literals) must come
  out the same with the current values;
* escapes: a Sym an op received without a matching ``PARAM`` (a value baked into a
  tensor or a static argument) makes the capture unusable for this: the function then
  keeps its hyperparameter values in its signature (:attr:`Capture.hyper_escaped`).

Not seen: a value derived from a Sym through ``math`` functions or ``float()`` (a plain
float again); the first time a hyperparameter changes, the function is re-traced once and
the graphs compared, so such a value shows as a changed constant
(:class:`xla_dtensor.jit.GraphChangedWarning`).

Example:
    >>> with recording() as rec:
    ...     lr = Sym(0.1, ("v", 0))
    ...     step = 1 - lr * 0.5
    ...     big = lr > 1
    >>> step.expr, rec.guards
    (('sub', ('c', 1), ('mul', ('v', 0), ('c', 0.5))), [(('v', 0), 'gt', ('c', 1), False)])
    >>> evaluate(step.expr, (0.2,))
    0.9
"""
from __future__ import annotations

import operator
from contextlib import contextmanager
from typing import Any, Iterator

import torch
from torch.overrides import TorchFunctionMode

from xla_dtensor.core.tensor import LazyTensor

_OPS = {"add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
        "pow": operator.pow, "floordiv": operator.floordiv, "mod": operator.mod,
        "eq": operator.eq, "ne": operator.ne, "lt": operator.lt, "le": operator.le, "gt": operator.gt,
        "ge": operator.ge}
_UNARY = {"neg": operator.neg, "pos": operator.pos, "abs": abs}


class Recorder:
    """What the Syms of one trace did: comparisons (``guards``), PARAM leaves made of them
    (``params``: id(leaf) -> expression; ``keep`` holds the leaves), and ``escapes``."""

    def __init__(self) -> None:
        self.guards: list[tuple] = []
        self.params: dict[int, tuple] = {}
        self.keep: list = []
        self.escapes: list[str] = []
        self.created: list = []


_REC: list[Recorder | None] = [None]


def _expr(x: Any) -> tuple | None:
    if type(x) is Sym:
        return x.expr
    if type(x) in (int, float, bool):
        return ("c", x)
    return None


class Sym(float):
    """A float that remembers its expression over the hyperparameters (see the module docstring)."""

    __slots__ = ("expr",)

    def __new__(cls, value: float, expr: tuple) -> Sym:
        s = float.__new__(cls, value)
        s.expr = expr
        return s

    def __repr__(self) -> str:
        return float.__repr__(self)

    __hash__ = float.__hash__

    def _bin(self, other: Any, name: str, rev: bool) -> Any:
        e = _expr(other)
        if e is None:
            return NotImplemented
        a, b = (float(other), float(self)) if rev else (float(self), float(other))
        v = _OPS[name](a, b)
        return Sym(v, (name, e, self.expr) if rev else (name, self.expr, e))

    def _cmp(self, other: Any, name: str) -> Any:
        e = _expr(other)
        if e is None:
            return NotImplemented
        r = _OPS[name](float(self), float(other))
        rec = _REC[0]
        if rec is not None:
            rec.guards.append((self.expr, name, e, r))
        return r

    def _un(self, name: str) -> Sym:
        return Sym(_UNARY[name](float(self)), (name, self.expr))

    def __bool__(self) -> bool:
        return self._cmp(0, "ne")

    def __neg__(self) -> Sym: return self._un("neg")
    def __pos__(self) -> Sym: return self._un("pos")
    def __abs__(self) -> Sym: return self._un("abs")
    def __add__(self, o: Any) -> Any: return self._bin(o, "add", False)
    def __radd__(self, o: Any) -> Any: return self._bin(o, "add", True)
    def __sub__(self, o: Any) -> Any: return self._bin(o, "sub", False)
    def __rsub__(self, o: Any) -> Any: return self._bin(o, "sub", True)
    def __mul__(self, o: Any) -> Any: return self._bin(o, "mul", False)
    def __rmul__(self, o: Any) -> Any: return self._bin(o, "mul", True)
    def __truediv__(self, o: Any) -> Any: return self._bin(o, "truediv", False)
    def __rtruediv__(self, o: Any) -> Any: return self._bin(o, "truediv", True)
    def __floordiv__(self, o: Any) -> Any: return self._bin(o, "floordiv", False)
    def __rfloordiv__(self, o: Any) -> Any: return self._bin(o, "floordiv", True)
    def __mod__(self, o: Any) -> Any: return self._bin(o, "mod", False)
    def __rmod__(self, o: Any) -> Any: return self._bin(o, "mod", True)
    def __pow__(self, o: Any) -> Any: return self._bin(o, "pow", False)
    def __rpow__(self, o: Any) -> Any: return self._bin(o, "pow", True)
    def __eq__(self, o: Any) -> Any: return self._cmp(o, "eq")
    def __ne__(self, o: Any) -> Any: return self._cmp(o, "ne")
    def __lt__(self, o: Any) -> Any: return self._cmp(o, "lt")
    def __le__(self, o: Any) -> Any: return self._cmp(o, "le")
    def __gt__(self, o: Any) -> Any: return self._cmp(o, "gt")
    def __ge__(self, o: Any) -> Any: return self._cmp(o, "ge")


def evaluate(expr: tuple, values: tuple) -> Any:
    """``expr`` (a :class:`Sym`'s expression) over the hyperparameter ``values``.

    Example:
        >>> evaluate(("neg", ("v", 1)), (0.5, 2.0))
        -2.0
    """
    kind = expr[0]
    if kind == "v":
        return values[expr[1]]
    if kind == "c":
        return expr[1]
    if len(expr) == 2:
        return _UNARY[kind](evaluate(expr[1], values))
    return _OPS[kind](evaluate(expr[1], values), evaluate(expr[2], values))


def guards_hold(guards: list[tuple], values: tuple) -> bool:
    """Whether every recorded comparison comes out as it did when traced."""
    try:
        return all(_OPS[op](evaluate(a, values), evaluate(b, values)) == r for a, op, b, r in guards)
    except (ArithmeticError, ValueError):
        return False


# --- the hyperparameters of a call's optimizers --------------------------------------------------

def _is_cpu_scalar(v: Any) -> bool:
    return (isinstance(v, torch.Tensor) and not isinstance(v, LazyTensor) and v.dim() == 0
            and v.device.type == "cpu" and v.dtype.is_floating_point and not v.requires_grad)


def bases(flat: list) -> list[tuple]:
    """``(flat index of the optimizer, group, key, item or None)`` per float hyperparameter (a
    float, a float in a tuple, a 0-d CPU tensor) of the optimizers among ``flat``.

    Example:
        >>> opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1, momentum=0.9)
        >>> [b[2] for b in bases([opt])]
        ['lr', 'momentum']
    """
    out = []
    for k, x in enumerate(flat):
        if not isinstance(x, torch.optim.Optimizer):
            continue
        for g, group in enumerate(x.param_groups):
            for key, v in group.items():
                if key == "params":
                    continue
                if type(v) is float or _is_cpu_scalar(v):
                    out.append((k, g, key, None))
                elif type(v) is tuple and any(type(i) is float or _is_cpu_scalar(i) for i in v):
                    out.extend((k, g, key, j) for j, i in enumerate(v) if type(i) is float or _is_cpu_scalar(i))
    return out


def _num(v: Any) -> float:
    return v if type(v) is float else float(v.item()) if isinstance(v, torch.Tensor) else float(v)


def values(flat: list, where: list[tuple]) -> tuple | None:
    """The current values of the hyperparameters at ``where`` (:func:`bases`); ``None`` when one
    is no longer a float or a 0-d CPU tensor (a new signature then)."""
    out = []
    for k, g, key, j in where:
        v = flat[k].param_groups[g].get(key)
        if j is not None:
            v = v[j] if type(v) is tuple and len(v) > j else None
        if not (type(v) is float or _is_cpu_scalar(v)):
            return None
        out.append(_num(v))
    return tuple(out)


@contextmanager
def substituted(flat: list, where: list[tuple]) -> Iterator[None]:
    """Within: each hyperparameter at ``where`` is a :class:`Sym` ``("v", i)``; restored after
    (unless the function replaced it)."""
    subs: dict[tuple, list] = {}  # (id(group), key) -> [group, key, old value, new value]
    for i, (k, g, key, j) in enumerate(where):
        group = flat[k].param_groups[g]
        ent = subs.get((id(group), key))
        if ent is None:
            ent = subs[(id(group), key)] = [group, key, group[key], group[key]]
        if j is None:
            ent[3] = Sym(_num(ent[2]), ("v", i))
        else:
            items = list(ent[3])
            items[j] = Sym(_num(ent[2][j]), ("v", i))
            ent[3] = tuple(items)
    for group, key, _, new in subs.values():
        group[key] = new
    try:
        yield
    finally:
        for group, key, old, _ in subs.values():
            if _holds_sym(group.get(key)):
                group[key] = old


def _holds_sym(v: Any) -> bool:
    return type(v) is Sym or (type(v) is tuple and any(type(i) is Sym for i in v))


# --- which PARAM leaf came from which Sym ---------------------------------------------------------

def _syms(args: tuple, kwargs: dict) -> list[Sym]:
    out = []
    for a in (*args, *kwargs.values()):
        if type(a) is Sym:
            out.append(a)
        elif type(a) in (list, tuple):
            out.extend(x for x in a if type(x) is Sym)
    return out


_ALPHA_FOREACH = {torch._foreach_add_, torch._foreach_add, torch._foreach_sub_, torch._foreach_sub}
_ALPHA_TENSOR = {torch.add, torch.sub, torch.Tensor.add, torch.Tensor.add_, torch.Tensor.sub, torch.Tensor.sub_}


def _tensor_alpha(func: Any, args: tuple, kwargs: dict) -> tuple | None:
    """``(args, kwargs)`` of an add/sub whose ``alpha`` is a 0-d device tensor (torch's SGD with a
    tensor lr: ``alpha=-lr``), rewritten as a product so that the lr is not read on the host
    (what torch itself does under ``torch.compile``); else ``None``."""
    alpha = kwargs.get("alpha")
    if not isinstance(alpha, LazyTensor) or alpha.dim() != 0 or len(args) < 2:
        return None
    rest = {k: v for k, v in kwargs.items() if k != "alpha"}
    if func in _ALPHA_FOREACH and type(args[1]) in (list, tuple):
        return (args[0], torch._foreach_mul(list(args[1]), alpha), *args[2:]), rest
    if func in _ALPHA_TENSOR and isinstance(args[1], torch.Tensor):
        return (args[0], args[1] * alpha, *args[2:]), rest
    return None


class Watch(TorchFunctionMode):
    """While tracing: map the ``PARAM`` leaves an op makes of Sym arguments to their expressions,
    and keep 0-d device tensors given as ``alpha`` on the device (:func:`_tensor_alpha`)."""

    def __init__(self, rec: Recorder) -> None:
        super().__init__()
        self.rec = rec

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if "alpha" in kwargs:
            new = _tensor_alpha(func, args, kwargs)
            if new is not None:
                args, kwargs = new
        syms = _syms(args, kwargs)
        if not syms:
            return func(*args, **kwargs)
        rec = self.rec
        n0 = len(rec.created)
        out = func(*args, **kwargs)
        made = rec.created[n0:]
        used: set[int] = set()
        for s in syms:
            v = float(s)
            if v == 0 or v == 1:  # the core compiles 0 and 1 as literals: the value must stay
                rec.guards.append((s.expr, "eq", ("c", v), True))
                continue
            p = next((p for p in made if id(p) not in used and type(p.data) is float and p.data == v), None)
            if p is None:
                rec.escapes.append(f"{getattr(func, '__name__', func)} took {s.expr} as a constant")
                continue
            used.add(id(p))
            rec.params[id(p)] = s.expr
            rec.keep.append(p)
        return out


@contextmanager
def recording() -> Iterator[Recorder]:
    """Record the Syms' comparisons, and (under :class:`Watch`) the PARAM leaves made of them."""
    from xla_dtensor.core import signature as core_sig
    rec = Recorder()
    make = core_sig.param_leaf

    def param_leaf(value: Any) -> Any:  # NOTE: the core's scalar-parameter leaf, noted as it is made
        node = make(value)
        rec.created.append(node)
        return node
    prev, _REC[0] = _REC[0], rec
    core_sig.param_leaf = param_leaf
    try:
        yield rec
    finally:
        core_sig.param_leaf = make
        _REC[0] = prev
