"""``__torch_dispatch__`` of the lazy tensor: record one IR node per aten op.

Hot path (a cached signature): compute the call's signature, look up its entry, make
(or reuse) the node, wrap the outputs. No meta kernels, no pytree, no JAX calls.
In eager mode (:mod:`.state`) the op is then computed at once (:mod:`.at_once`).
"""
from __future__ import annotations

from typing import Any

from xla_dtensor.core import entries as E
from xla_dtensor.core.ir import data_leaf, getitems, make_node
from xla_dtensor.core.optable import OpTable
from xla_dtensor.core.signature import op_info, signature
from xla_dtensor.core.state import STATE
from xla_dtensor.core.tensor import LazyTensor, new_tensor, new_view, value_of, write
from xla_dtensor.core.views import ViewStep
from xla_dtensor.random import next_key

class _Op:
    """What recording needs of one op, found by ``id(op)`` in one lookup (core.optable: hashing an
    OpOverload runs Python)."""

    __slots__ = ("info", "entries", "static_scalars", "returns_list")

    def __init__(self, op: Any) -> None:
        self.info = op_info(op)
        self.entries: dict[tuple, E.Entry] = {}  # call signature -> entry
        self.static_scalars = False  # the lowering needs scalars as Python values
        rets = op._schema.returns
        self.returns_list = len(rets) == 1 and str(rets[0].type) == "List[Tensor]"


_ENTRIES: dict[int, _Op] = {}  # id(op) -> its recording state
SPECIAL = OpTable()  # op -> handler(op, args, kwargs), filled by core.special
_SPECIAL = SPECIAL.by_id
_KEY_META = ((2,), "key")


def dispatch(op: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``op`` (a special handler's way, else one IR node); in eager mode, compute it now."""
    special = _SPECIAL.get(id(op))
    res = record(op, args, kwargs) if special is None else special(op, args, kwargs)
    if STATE.consing:  # NOTE: off exactly while the op runs at once (eager mode, not tracing for compile)
        return res
    return at_once.compute_now(op, args, kwargs, res)


def record(op: Any, args: tuple, kwargs: dict) -> Any:
    """Record ``op`` as one IR node (:func:`dispatch` without the special handlers)."""
    st = _ENTRIES.get(id(op))
    if st is None:
        st = _ENTRIES[id(op)] = _Op(op)
    dyn: list = []
    sig = signature(args, kwargs, st.info, not st.static_scalars, dyn)
    return _recorded(op, args, kwargs, st, sig, dyn)


def _recorded(op: Any, args: tuple, kwargs: dict, st: _Op, sig: tuple, dyn: list) -> Any:
    """:func:`record` after the call's signature ``sig`` and graph inputs ``dyn``."""
    info = st.info
    entry = st.entries.get(sig)
    if entry is None:
        key = (op, sig)
        if info.out_kw:
            from xla_dtensor.core import out_variants
            return out_variants.run(op, info, args, kwargs)
        entry = E.build(op, args, kwargs, info, key, not st.static_scalars)
        if entry is None:  # the lowering wants Python scalars: record with static scalars
            st.static_scalars = True
            return record(op, args, kwargs)
        st.entries[sig] = entry
    kind = entry.kind
    if kind is E.FALLBACK:
        from xla_dtensor.core.fallback import run_on_cpu
        return run_on_cpu(op, args, kwargs)
    if entry.random:
        dyn.insert(0, data_leaf(next_key(), *_KEY_META))
    node = make_node(op, entry.key, entry.h, tuple(dyn), entry.fn)
    if kind is E.FN:
        outs = entry.outs
        if len(outs) == 1 and not st.returns_list:
            return new_tensor(outs[0], node)
        return _wrap_many(st.returns_list, outs, node)
    if kind is E.VIEW:
        return _views(st.returns_list, entry, args[0], node)
    return _inplace(st.returns_list, info, entry, node, args, kwargs)


def entry_for(key: tuple) -> E.Entry | None:
    """The recorded entry of node key ``key`` (``(op, signature)``), or None."""
    st = _ENTRIES.get(id(key[0]))
    return None if st is None else st.entries.get(key[1])


def _wrap_many(listed: bool, outs: list, node: Any) -> Any:
    items = getitems(node, [i for i, m in enumerate(outs) if m is not None])
    it = iter(items)
    res = [None if m is None else new_tensor(m, next(it)) for m in outs]
    return res if listed else tuple(res)


def _views(listed: bool, entry: E.Entry, base: LazyTensor, node: Any) -> Any:
    storage, chain = base._storage, base._chain
    if not listed and len(entry.outs) == 1:
        step = entry.step
        if step is None:
            step = entry.step = ViewStep(entry, None)
        return new_view(entry.outs[0], storage, chain + (step,), node)
    items = getitems(node, range(len(entry.outs)))
    res = [new_view(m, storage, chain + (ViewStep(entry, i),), items[i]) for i, m in enumerate(entry.outs)]
    return res if listed else tuple(res)


def _inplace(listed_ret: bool, info: Any, entry: E.Entry, node: Any, args: tuple, kwargs: dict) -> Any:
    targets: list[Any] = []
    listed = False  # a mutated list (``_foreach_*_``): the lowering returns a list, even of one tensor
    for pos, name in info.mutated:
        a = args[pos] if pos is not None and pos < len(args) else kwargs.get(name)
        listed = listed or isinstance(a, (list, tuple))
        targets.extend(a if isinstance(a, (list, tuple)) else [a])
    n_ret = entry.n_ret
    total = n_ret + len(targets)
    if total == 1 and not listed:
        write(targets[0], node)
    else:
        kept = entry.kept
        written = [i for i, t in enumerate(targets) if t is not None and i not in kept]
        owner = STATE.owner
        values = getitems(node, [n_ret + i for i in written])
        if listed and len(written) > 1 and not targets[written[0]]._meta[0] and entry.foreach:
            values = _shared_items(args, kwargs, len(targets), written, values)
        for i, value in zip(written, values):
            write(targets[i], value, owner)
    if info.n_returns == 0:
        return None
    values = getitems(node, range(n_ret)) if total > 1 else [node][:n_ret]
    own = [new_tensor(entry.outs[i], v) for i, v in enumerate(values)]
    if n_ret == 0:
        return targets[0] if info.n_returns == 1 and not listed_ret else targets
    if info.n_returns == 1:
        return own[0]
    rets, it_own, it_tgt = [], iter(own), iter(targets)
    for alias in info.returns_alias:
        rets.append(next(it_tgt) if alias else next(it_own))
    return tuple(rets)


def _shared_items(args: tuple, kwargs: dict, n: int, written: list[int], values: list) -> list:
    """``values`` (a ``_foreach_*`` op's new values of 0-d targets ``written``), where items ``i`` and ``j``
    read the same inputs, both ``j``'s: their values are one node.

    NOTE: torch keeps one step counter per parameter, all equal: created alike, the counters of a
    fused AdamW step are one value, which ``sync()`` then computes once and binds to every counter
    (one program argument and output instead of ~200 on the 12-layer benchmark GPT). Only for 0-d
    targets: the check reads every item of every list argument.
    """
    cols = [a for a in (*args, *kwargs.values()) if isinstance(a, (list, tuple)) and len(a) == n]
    first: dict[tuple, int] = {}
    at: list[int] = []
    for i in range(n):
        item = []
        for col in cols:
            x = col[i]
            if isinstance(x, LazyTensor):
                item.append(id(value_of(x)))
            elif type(x) in (int, float, bool):
                item.append((type(x), x))
            else:
                return values
        at.append(first.setdefault(tuple(item), i))
    pos = {i: k for k, i in enumerate(written)}
    return [values[pos.get(at[i], k)] for k, i in enumerate(written)]


# The common cases of record in C (core.native): a known signature of a plain op (its outputs a tensor or a
# tuple of tensors) or of a view with one output.
from xla_dtensor.core import native as _native  # noqa: E402

if _native.ON:
    _native.MODULE.configure_record(_ENTRIES, record, _recorded, E.FN, E.VIEW, getitems)
    record = _native.MODULE.record  # noqa: F811

# NOTE: at the end: at_once imports the executor, which imports the tensor module that imports this one
from xla_dtensor.core import at_once  # noqa: E402

if _native.ON:  # the lazy tensor's __torch_dispatch__ and dispatch in C, with the same steps
    from xla_dtensor.core import tensor as _tensor, threads as _threads
    _native.MODULE.configure_dispatch(_SPECIAL, at_once.compute_now, _threads.enter, _tensor._dispatch_error,
                                      _threads._THIS, _threads._USER, globals())
    dispatch = _native.MODULE.dispatch  # noqa: F811
    LazyTensor.__torch_dispatch__ = classmethod(_native.MODULE.torch_dispatch)  # type: ignore[assignment]
    from xla_dtensor.core import cxx as _cxx
    if _cxx.MODULE is not None:  # the hot ops' calls reach that entry from torch's C++ without its fallback
        _cxx.install(LazyTensor, _native.MODULE.torch_dispatch)
