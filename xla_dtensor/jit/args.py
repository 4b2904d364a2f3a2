"""Arguments of a compiled function: flattening and the input signature.

The signature of a call is a hashable tuple: every lazy tensor appears as its
metadata (shape, dtype, stride) plus its view chain, a CPU tensor as (shape, dtype),
an ``nn.Module`` by identity and training flag, an optimizer by identity, state size
and scalar hyperparameters, and any other value by value (by identity if unhashable).
Tensors, modules and optimizers are also collected, in order, into
``flat``: the replay reads a call's inputs from there by position.
"""
from __future__ import annotations

from typing import Any

import torch

from xla_dtensor.core.autocast import state as autocast_state
from xla_dtensor.core.tensor import LazyTensor, chain_of, meta_of

_SCALARS = (int, float, bool, str, complex, type(None))


def _hyper_value(v: Any, static: bool) -> Any:
    """A hyperparameter in the signature: floats and 0-d CPU tensors are program inputs
    (:mod:`xla_dtensor.jit.hyper`), so only their kind counts, unless ``static``."""
    tp = type(v)
    if tp is float:
        return v if static else float
    if tp is tuple:
        return tuple([_hyper_value(i, static) for i in v])
    if tp in _SCALARS:
        return v
    if isinstance(v, torch.Tensor) and not isinstance(v, LazyTensor) and v.dim() == 0 and v.device.type == "cpu":
        return ("cpu0", v.dtype, v.item() if static or not v.dtype.is_floating_point else None)
    return _SKIP


_SKIP = object()


def _hyper(opt: torch.optim.Optimizer, static: bool = False) -> tuple:
    out = []
    for g in opt.param_groups:
        items = [(k, _hyper_value(v, static)) for k, v in g.items() if k != "params"]
        out.append(tuple([(k, v) for k, v in items if v is not _SKIP]))
    return tuple(out)


def chain_key(t: LazyTensor) -> tuple:
    """``t``'s view chain as a hashable key: ``()`` for a root, else the view ops by identity."""
    chain = chain_of(t)
    return tuple([(id(s.entry), s.index) for s in chain]) if chain else ()


def _sig(x: Any, flat: list, static: bool = False) -> Any:
    tp = type(x)
    if tp in _SCALARS:
        return (tp, x)
    if isinstance(x, LazyTensor):
        flat.append(x)
        return ("T", meta_of(x), chain_key(x))
    if isinstance(x, torch.Tensor):
        flat.append(x)
        return ("H", tuple(x.shape), x.dtype)
    if tp is tuple or tp is list:
        return (tp, tuple([_sig(v, flat, static) for v in x]))
    if tp is dict:
        return (dict, tuple([(k, _sig(v, flat, static)) for k, v in x.items()]))
    if isinstance(x, torch.nn.Module):
        flat.append(x)
        return ("M", id(x), x.training)
    if isinstance(x, torch.optim.Optimizer):
        flat.append(x)
        return ("O", id(x), len(x.state), _hyper(x, static))
    try:
        hash(x)
    except TypeError:
        return ("id", id(x))
    return (tp, x)


HIDDEN = "hidden"


def signature(args: tuple, kwargs: dict, flat: list, hidden: tuple = (), static: bool = False) -> tuple:
    """The call's signature; appends its tensors, modules and optimizers to ``flat``.

    ``hidden``: the Python values the function reads from its globals and closure
    (:mod:`xla_dtensor.jit.hidden`), as ``((name, snapshot), ...)``. An optimizer's float
    hyperparameters (and 0-d CPU tensor ones) count by kind only: they are program inputs;
    ``static``: by value (a function whose trace could not make them inputs).

    Example:
        >>> import torch
        >>> flat = []
        >>> signature((torch.zeros(2), 3), {}, flat)[1]
        (<class 'int'>, 3)
    """
    key = tuple([_sig(a, flat, static) for a in args])
    if kwargs:
        key += tuple([(k, _sig(v, flat, static)) for k, v in kwargs.items()])
    if hidden:
        key += ((HIDDEN, hidden),)
    return key + (torch.is_grad_enabled(), autocast_state())


def describe_change(old: tuple, new: tuple) -> str:
    """Which argument differs between two signatures, in words.

    Example:
        >>> describe_change(((int, 1), True, None), ((int, 2), True, None))
        'argument 0: (int, 1) -> (int, 2)'
    """
    if len(old) != len(new):
        return f"number of arguments {len(old) - 2} -> {len(new) - 2}"
    for i, (a, b) in enumerate(zip(old, new)):
        if a != b:
            if i == len(old) - 1:
                return f"autocast dtype on the device {a} -> {b}"
            if i == len(old) - 2:
                return f"torch.is_grad_enabled() {a} -> {b}"
            if _kind(a) == _kind(b) == HIDDEN:
                return _hidden_change(a[1], b[1])
            if _kind(a) == _kind(b) == "O":
                return f"argument {i}: optimizer {_optimizer_change(a, b)}"
            return f"argument {i}: {_words(a)} -> {_words(b)}"
    return "no argument changed"


def _hidden_change(a: tuple, b: tuple) -> str:
    """Which global or closure value differs between two ``hidden`` signature parts."""
    old, new = dict(a), dict(b)
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            return f"global or closure variable {name!r}: {_value(old.get(name))} -> {_value(new.get(name))}"
    return "a global or closure variable changed"


def _value(snap: Any) -> str:
    """A :func:`xla_dtensor.jit.hidden.snapshot` back as text."""
    if snap is None:
        return "(not Python data)"
    tp, v = snap
    if tp is dict:
        return "{" + ", ".join(f"{_value(k)}: {_value(x)}" for k, x in v) + "}"
    if tp in (list, tuple, set, frozenset):
        inner = ", ".join(_value(x) for x in v)
        return {list: f"[{inner}]", tuple: f"({inner})"}.get(tp, "{" + inner + "}")
    return repr(v)


def _kind(s: Any) -> Any:
    return s[0] if isinstance(s, tuple) and s and isinstance(s[0], str) else None


def _optimizer_change(a: tuple, b: tuple) -> str:
    """What differs between two optimizer signatures ``("O", id, state entries, hyperparameters)``."""
    parts = []
    if a[1] != b[1]:
        parts.append("is another object")
    if a[2] != b[2]:
        parts.append(f"state entries {a[2]} -> {b[2]}")
    for g, (ga, gb) in enumerate(zip(a[3], b[3])):
        changed = [f"{k} {dict(ga).get(k)!r} -> {v!r}" for k, v in gb if dict(ga).get(k) != v]
        if changed:
            parts.append(f"param group {g}: " + ", ".join(changed))
    if len(a[3]) != len(b[3]):
        parts.append(f"param groups {len(a[3])} -> {len(b[3])}")
    return "; ".join(parts) or "changed"


def _words(s: Any) -> str:
    if isinstance(s, tuple) and s and s[0] == "T":
        shape, dtype, _ = s[1]
        return f"tensor {str(dtype).replace('torch.', '')}{list(shape)}" + (" (view)" if s[2] else "")
    if isinstance(s, tuple) and s and s[0] == "H":
        return f"CPU tensor {str(s[2]).replace('torch.', '')}{list(s[1])}"
    if isinstance(s, tuple) and s and s[0] == "O":
        return f"optimizer with {s[2]} state entries, hyperparameters {s[3]}"
    if isinstance(s, tuple) and s and s[0] == "M":
        return f"module (training={s[2]})"
    if isinstance(s, tuple) and len(s) == 2 and isinstance(s[0], type):
        return f"({s[0].__name__}, {s[1]!r})"
    return repr(s)
