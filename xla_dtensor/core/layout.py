"""How a sharded value is stored: sharding-constraint nodes, device placement, uneven padding.

Invariants:

* A sharding *annotation* on a pending value is a ``sharding_constraint`` node (an
  identity whose ``Node.sharding`` the executor applies with
  ``jax.lax.with_sharding_constraint``); its key holds the sharding, so the program
  cache tells layouts apart.
* Device data of an **even** layout is a ``jax.Array`` with that ``NamedSharding``.
* A storage's *sticky* layout (``Storage.layout``, even) is held at ``sync()`` as the
  program's output sharding of its value, not as a constraint node (:func:`stored_shardings`);
  ``compile``'s traces, which build their programs from nodes, get constraint nodes.
* Device data of an **uneven** layout (a dim not divisible by its shard count; JAX
  arrays cannot hold one) is stored padded with zeros to ``ceil(n/k)*k`` rows, evenly
  sharded, behind an ``unpad`` node that slices it back to the logical shape and
  constrains the result to the logical (uneven) sharding, which XLA supports inside a
  program. Every tensor the user sees has the logical shape.
"""
from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

from xla_dtensor.core import native, state
from xla_dtensor.core.dtypes import to_jax
from xla_dtensor.core.ir import DATA, Node, data_leaf, make_node
from xla_dtensor.sharding import ShardingSpec

CONSTRAINT, UNPAD, PAD = "sharding_constraint", "unpad", "pad"
_c_constrain_stored = native.MODULE.constrain_stored if native.ON else None
_c_stored_shardings = native.MODULE.stored_shardings if native.ON else None
_FNS: dict[tuple, Any] = {}


def _identity(x: Any) -> Any:
    return x


# NOTE: cached: the sticky-annotation hook asks for every annotated storage at every sync (a 2x4
# Megatron GPT-2 step built 128 ShardingSpecs per sync for it, ~1 ms of host time).
@functools.lru_cache(maxsize=4096)
def named(spec: ShardingSpec) -> jax.sharding.NamedSharding:
    """The JAX sharding of ``spec`` after its pending reductions (on the root mesh)."""
    return spec.reduced().on_root().to_named_sharding()


@functools.lru_cache(maxsize=4096)
def _root_counts(spec: ShardingSpec) -> tuple[int, ...]:
    return spec.on_root().shard_counts


def is_even(spec: ShardingSpec, shape: tuple[int, ...]) -> bool:
    """Whether every dim of ``shape`` divides by its shard count."""
    return all(n % k == 0 for n, k in zip(shape, _root_counts(spec)))


def padded_shape(spec: ShardingSpec, shape: tuple[int, ...]) -> tuple[int, ...]:
    """``shape`` with each sharded dim rounded up to a multiple of its shard count."""
    return tuple(-(-n // k) * k for n, k in zip(shape, _root_counts(spec)))


# id(sharding) -> (sharding, key, its hash): hashing a NamedSharding runs Python, and every sync of a
# sharded model constrains each sticky parameter and optimizer state (~1,800 in a GPT-2 step)
_CONSTRAINT_KEYS: dict[int, tuple[Any, tuple, int]] = {}


def constraint_key(sharding: Any) -> tuple[tuple, int]:
    """(the key of a constraint node to ``sharding``, the key's hash)."""
    hit = _CONSTRAINT_KEYS.get(id(sharding))
    if hit is None or hit[0] is not sharding:
        if len(_CONSTRAINT_KEYS) >= 4096:
            _CONSTRAINT_KEYS.clear()
        key = (CONSTRAINT, sharding)
        hit = _CONSTRAINT_KEYS[id(sharding)] = (sharding, key, hash(key))
    return hit[1], hit[2]


def constrain(value: Node, sharding: Any) -> Node:
    """``value`` annotated with ``sharding`` (a ``NamedSharding``)."""
    key, h = constraint_key(sharding)
    node = make_node(CONSTRAINT, key, h, (value,), _identity)
    node.sharding = sharding
    return node


def constrain_stored(pending: list[Any], table: dict[tuple, tuple]) -> list[Any]:
    """Constrain each storage of ``pending`` whose layout ``table`` knows to its sharding; returns the
    storages with a layout it does not know.

    ``table[(id(layout), shape)]`` is ``(layout, sharding, *constraint_key(sharding))`` for an even
    layout of that shape. A value already constrained to the sharding is kept.
    NOTE: in C when the core records there (a sharded step's sync lays out every sticky parameter and
    optimizer state: ~600 in a 12-layer GPT step, ~2 us each in Python).
    """
    if _c_constrain_stored is not None:
        rest = _c_constrain_stored(pending, table, CONSTRAINT, _identity)
        if rest is not NotImplemented:
            return rest
    rest = []
    for s in pending:
        spec = s.layout
        if spec is None:
            continue
        e = table.get((id(spec), s.meta[0]))
        if e is None or e[0] is not spec:
            rest.append(s)
            continue
        if not is_constraint(s.value, e[1]):
            s.value = constrain(s.value, e[1])
    return rest


# (id(layout), shape) -> (layout, its NamedSharding, even, padded shape or None): every sync of a sharded
# model asks for each sticky parameter and optimizer state (~600 in an AUTO-planned 12-layer GPT step)
_LAID: dict[tuple, tuple] = {}


def laid(spec: ShardingSpec, shape: tuple[int, ...]) -> tuple[ShardingSpec, Any, bool, tuple[int, ...] | None]:
    """``(spec, named(spec), is_even(spec, shape), padded_shape or None)``, made once per (layout, shape)."""
    d = _LAID.get((id(spec), shape))
    if d is None or d[0] is not spec:
        if len(_LAID) >= 4096:
            _LAID.clear()
        even = is_even(spec, shape)
        d = _LAID[(id(spec), shape)] = (spec, named(spec), even, None if even else padded_shape(spec, shape))
    return d


def stored_shardings(pending: list[Any]) -> tuple[list[Any], list[Any]]:
    """(per storage of ``pending``, the sharding of its even sticky layout or None; the storages whose
    sticky layout is uneven).

    Example:
        >>> stored_shardings([])
        ([], [])
    """
    got = NotImplemented if _c_stored_shardings is None else _c_stored_shardings(pending, _LAID)
    if got is NotImplemented:  # NOTE: the C look-ups: ~0.3 ms of an AUTO-planned GPT step's sync in Python
        got = [None] * len(pending), [i for i, s in enumerate(pending) if s.layout is not None]
    out, rest = got  # rest: the storages with a layout the table did not resolve to an even sharding
    uneven: list[Any] = []
    for i in rest:
        s = pending[i]
        d = laid(s.layout, s.meta[0])
        if d[2]:
            out[i] = d[1]
        else:
            uneven.append(s)
    return out, uneven


def is_constraint(node: Node, sharding: Any = None) -> bool:
    return node.op == CONSTRAINT and (sharding is None or node.sharding is sharding or node.sharding == sharding)


def unpad(padded: Node, shape: tuple[int, ...], sharding: Any) -> Node:
    """The logical ``shape`` slice of a padded value, constrained to ``sharding``."""
    key = (UNPAD, shape)
    fn = _FNS.get(key)
    if fn is None:
        index = tuple(slice(0, n) for n in shape)
        fn = _FNS[key] = lambda x: x[index]
    sliced = make_node(UNPAD, key, hash(key), (padded,), fn)
    return constrain(sliced, sharding)


def pad(value: Node, shape: tuple[int, ...], pshape: tuple[int, ...], sharding: Any) -> Node:
    """``value`` zero-padded from ``shape`` to ``pshape``, constrained to ``sharding``."""
    key = (PAD, shape, pshape)
    fn = _FNS.get(key)
    if fn is None:
        widths = tuple((0, p - n) for n, p in zip(shape, pshape))
        fn = _FNS[key] = lambda x: jnp.pad(x, widths)
    return constrain(make_node(PAD, key, hash(key), (value,), fn), sharding)


def padded_source(value: Node) -> Node | None:
    """The padded device-data leaf behind an ``unpad`` value, else ``None``."""
    if is_constraint(value) and value.inputs[0].op == UNPAD:
        leaf = value.inputs[0].inputs[0]
        return leaf if leaf.op == DATA else None
    return None


def place_host(host: torch.Tensor, spec: ShardingSpec) -> Node:
    """Put CPU tensor ``host`` on the devices laid out as ``spec``, shard by shard.

    Each device receives only its own slice (no device ever holds the whole tensor).
    """
    shape = tuple(host.shape)
    arr = _numpy(host)
    ns = named(spec)
    if is_even(spec, shape):
        out = jax.make_array_from_callback(shape, ns, lambda idx: arr[idx])
        return data_leaf(out, shape, host.dtype)
    pshape = padded_shape(spec, shape)
    padded = np.zeros(pshape, arr.dtype)
    padded[tuple(slice(0, n) for n in shape)] = arr
    out = jax.make_array_from_callback(pshape, ns, lambda idx: padded[idx])
    return unpad(data_leaf(out, pshape, host.dtype), shape, ns)


def reshard(value: Node, shape: tuple[int, ...], dtype: torch.dtype, spec: ShardingSpec) -> Node:
    """``value`` laid out as ``spec``: device data moves now, a pending value gets a constraint."""
    ns = named(spec)
    if state.STATE.capturing:  # inside a compiled function: a constraint in the program, replayed every call
        return constrain(value, ns)
    src = padded_source(value)
    if src is not None:  # an uneven value whose data is already on the devices
        value = data_leaf(_jitted(("unpad", shape), None)(src.data), shape, dtype)
    if value.op != DATA or not isinstance(value.data, jax.Array):
        return constrain(value, ns)
    if is_even(spec, shape):
        return data_leaf(jax.device_put(value.data, ns), shape, dtype)
    pshape = padded_shape(spec, shape)
    out = _jitted(("pad", shape, pshape), ns)(value.data)
    return unpad(data_leaf(out, pshape, dtype), shape, ns)


_JITTED: dict[tuple, Any] = {}


def _jitted(key: tuple, sharding: Any) -> Any:
    """A cached jitted pad/unpad program whose output has ``sharding`` (``None``: XLA's choice)."""
    fn = _JITTED.get((key, sharding))
    if fn is None:
        if key[0] == "pad":
            widths = tuple((0, p - n) for n, p in zip(key[1], key[2]))
            body = lambda x: jnp.pad(x, widths)  # noqa: E731
        else:
            index = tuple(slice(0, n) for n in key[1])
            body = lambda x: x[index]  # noqa: E731
        fn = _JITTED[(key, sharding)] = jax.jit(body, out_shardings=sharding)
    return fn


def _numpy(host: torch.Tensor) -> np.ndarray:
    c = host.detach().cpu()
    if c.dtype == torch.bfloat16:
        return c.float().numpy().astype(to_jax(torch.bfloat16))
    # NOTE: not np.ascontiguousarray, which turns a 0-d array (BatchNorm's num_batches_tracked) into shape (1,)
    return np.asarray(c.resolve_conj().resolve_neg().contiguous().numpy()).reshape(tuple(host.shape))
