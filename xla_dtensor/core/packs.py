"""Packed state: a step's updated tensors leave its program as one array per (dtype, layout).

JAX does host work for every array a program takes and returns, and for every array that
dies (``benchmarks/jax_array_costs.py``: 588 AdamW state tensors of the 12-layer benchmark
GPT cost 0.98 ms a step on one device and 2.53 ms split 8 ways; packed by layout, 0.09 and
0.15 ms). So at ``sync()`` the pending values are grouped by dtype and layout, and each
group leaves the program as one **pack** of shape ``(rows, columns)``:

* a value is packed when its layout is known before the program runs: the one device the
  whole program runs on, or (with ``config.pack_mesh_state`` on: off by default, see there) the
  sticky one a sync hook holds it in (``mark_sharding``, ``distribute_tensor``, FSDP, AUTO's plan);
  values XLA lays out on several devices stay arrays of their own (:func:`outputs` says why);
* 0-d values, and values over :data:`MAX_BYTES`, stay arrays of their own;
* a tensor split ``k`` ways goes in shard-major, as ``(k, numel / k)``: row ``i`` holds what
  device ``i`` of the pack's row axes holds, so packing and unpacking move nothing between
  devices; every tensor of a pack is split over the same mesh axes, in the same order;
* each storage's new value is a device-data leaf whose ``raw`` is its :class:`Pack` and whose
  key's fifth entry is its place in it; the next program takes the pack as one argument,
  slices its members inside (:class:`Inputs`) and writes each new pack into a new buffer
  (:meth:`Layout.pack`; the old pack is freed when no storage holds a member of it);
* anything else that reads such a leaf's ``data`` (a host read, eager mode, ``compile``'s
  replay, a checkpoint) gets its own array: the whole pack is unpacked in one program, once,
  and the arrays are kept while the pack lives (its members' memory twice, until the next
  sync rewrites them).

A pack is never donated: written over its old self, XLA copied the whole pack twice a step
(:meth:`Layout.pack`). A new pack costs the same peak memory (the old pack and the new one, against
the old one and two copies), and a tensor over :data:`MAX_BYTES` is never packed. Packing is off
under ``compile``'s capture;
``xla_dtensor.config.pack_state = False`` turns it off.

Example:
    >>> import torch, xla_dtensor
    >>> from xla_dtensor.core.tensor import value_of
    >>> a, b = torch.zeros(4, device=xla_dtensor.device()), torch.ones(4, device=xla_dtensor.device())
    >>> xla_dtensor.sync()
    >>> _ = a.add_(1), b.mul_(3)
    >>> xla_dtensor.sync()
    >>> value_of(a).raw is value_of(b).raw, b.cpu().tolist()
    (True, [3.0, 3.0, 3.0, 3.0])
"""
from __future__ import annotations

import array
import functools
import itertools
import math
from typing import Any, Callable

import jax
from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

from xla_dtensor.config import config
from xla_dtensor.core import ir
from xla_dtensor.core.dtypes import to_jax
from xla_dtensor.core.ir import DATA, canonical

MIN_MEMBERS = 2  # a group of one is left as it is


class Layout:
    """Where each member of a pack lies: shapes, shard-major splits, column offsets, shardings.

    One object per (group key, member shapes): programs are cached by its identity.
    """

    __slots__ = ("dtype", "sharding", "rows", "shapes", "splits", "offsets", "sizes", "member_shardings",
                 "keys", "_unpack_all", "__weakref__")

    def __init__(self, dtype: Any, sharding: Any, rows: int, shapes: tuple, splits: tuple,
                 member_shardings: tuple, torch_dtype: Any) -> None:
        self.dtype, self.sharding, self.rows, self.shapes, self.splits = dtype, sharding, rows, shapes, splits
        self.member_shardings = member_shardings
        self.sizes = tuple(math.prod(s) // rows for s in shapes)
        self.offsets = tuple(itertools.accumulate(self.sizes, initial=0))[:-1]
        # each member's leaf key (its index fifth) and hash (that of the member's own array's leaf)
        self.keys = [((DATA, shape, torch_dtype, sh, i), hash((DATA, shape, torch_dtype, canonical(sh))))
                     for i, (shape, sh) in enumerate(zip(shapes, member_shardings))]
        self._unpack_all: Callable[[Any], tuple] | None = None

    @property
    def out_sharding(self) -> Any:
        """The pack's sharding as a program's output: None (as XLA places it) on one device.

        NOTE: an output given a ``SingleDeviceSharding`` is committed to its device, and a later program that
        mixes it with arrays on the mesh fails; a single-device program of uncommitted arrays leaves its
        outputs uncommitted, as an array per tensor was."""
        return None if isinstance(self.sharding, SingleDeviceSharding) else self.sharding

    @property
    def columns(self) -> int:
        return sum(self.sizes)

    def pack(self, values: list[Any]) -> Any:
        """The pack of ``values`` (traced; the program's output sharding is :attr:`sharding`): each written in
        place into a new pack of zeros.

        NOTE: a new pack, not the old one donated: XLA could not order every read of the old pack before the
        first write into it and copied the whole pack twice a step; a ``concatenate`` made every member an
        array of its own first, then copied them (docs/lazy_core.md, "Packed state")."""
        out = jax.numpy.zeros((self.rows, self.columns), self.dtype)
        if self.out_sharding is not None:
            out = jax.lax.with_sharding_constraint(out, self.sharding)
        for v, shape, split, off in zip(values, self.shapes, self.splits, self.offsets):
            if tuple(v.shape) != shape:  # NOTE: a bug, never silent: a value's shape is its storage's
                raise AssertionError(f"packing a value of shape {tuple(v.shape)} as {shape}")
            out = jax.lax.dynamic_update_slice_in_dim(out, _to_rows(v, split, self.rows).astype(out.dtype), off, axis=1)
        return out

    def unpack(self, pack: Any, i: int) -> Any:
        """Member ``i`` of ``pack`` (traced), in its own layout."""
        part = jax.lax.slice_in_dim(pack, self.offsets[i], self.offsets[i] + self.sizes[i], axis=1)
        v = _from_rows(part, self.shapes[i], self.splits[i])
        sh = self.member_shardings[i]
        return v if isinstance(sh, SingleDeviceSharding) else jax.lax.with_sharding_constraint(v, sh)

    def unpack_all(self, pack: Any) -> tuple:
        """Every member of ``pack`` as its own array (one program, compiled once per layout)."""
        if self._unpack_all is None:
            n = len(self.shapes)
            given = {} if self.out_sharding is None else {"out_shardings": self.member_shardings}
            self._unpack_all = jax.jit(lambda p: tuple(self.unpack(p, i) for i in range(n)), **given)
        return self._unpack_all(pack)


def _to_rows(v: Any, split: tuple[int, ...], rows: int) -> Any:
    """``v`` shard-major as ``(rows, numel / rows)``: dim ``d`` cut into ``split[d]`` blocks, the blocks' indices
    first (row-major), so row ``r`` is the block device ``r`` of the pack's row axes holds."""
    if rows == 1:
        return v.reshape(1, -1)
    cut = [x for d, k in zip(v.shape, split) for x in (k, d // k)]
    n = len(split)
    order = [2 * d for d in range(n)] + [2 * d + 1 for d in range(n)]
    return v.reshape(cut).transpose(order).reshape(rows, -1)


def _from_rows(part: Any, shape: tuple[int, ...], split: tuple[int, ...]) -> Any:
    """The inverse of :func:`_to_rows`."""
    if part.shape[0] == 1:
        return part.reshape(shape)
    n = len(shape)
    blocks = list(split) + [d // k for d, k in zip(shape, split)]
    order = [x for d in range(n) for x in (d, n + d)]
    return part.reshape(blocks).transpose(order).reshape(shape)


class Pack:
    """One packed array of a sync's outputs: the raw data of each member's leaf."""

    __slots__ = ("array", "layout", "arrays", "__weakref__")

    def __init__(self, array: Any, layout: Layout) -> None:
        self.array, self.layout = array, layout
        self.arrays: tuple | None = None  # the members unpacked, once one was read

    def __repr__(self) -> str:
        return f"Pack({len(self.layout.shapes)} members, {self.layout.rows}x{self.layout.columns} {self.layout.dtype})"


def read(node: Any) -> Any:
    """A packed member's own array (``node.data``): its pack unpacked once, in one program."""
    pack = node.raw
    if pack.arrays is None:
        if pack.array.is_deleted():
            raise RuntimeError(f"{node!r} is a member of {pack!r}, whose buffer was freed; "
                               "no live tensor holds this value any more")
        pack.arrays = pack.layout.unpack_all(pack.array)
    return pack.arrays[node.key[4]]


def array_of(node: Any) -> Any:
    """The device object a leaf holds without unpacking: its pack's array for a packed member, else its data."""
    raw = node.raw
    return raw.array if type(raw) is Pack else raw


ir.PACKED[:] = [Pack, read]
if ir._native.ON:
    ir._native.MODULE.configure_packed(Pack, read)


# ------------------------------------------------------------------------------------------ outputs


class Outputs:
    """How a sync's distinct pending values leave its program: ``kept`` (positions) as themselves, then
    one pack per group (``groups``: (layout, positions))."""

    __slots__ = ("kept", "groups", "inverse", "sig")

    def __init__(self, n: int, groups: list[tuple[Layout, list[int]]]) -> None:
        packed = {k for _, ks in groups for k in ks}
        self.kept = [k for k in range(n) if k not in packed]
        self.groups = groups
        # where value k's leaf is in kept leaves + every group's member leaves
        at = self.kept + [k for _, ks in groups for k in ks]
        self.inverse = [0] * n
        for j, k in enumerate(at):
            self.inverse[k] = j
        self.sig = (tuple(self.kept), tuple((id(lay), tuple(ks)) for lay, ks in groups))

    def shardings(self, held: tuple | None, n_more: int) -> tuple:
        """The program's output shardings: the kept values' (``held``: per value, None: as XLA propagates),
        the packs', then ``n_more`` unconstrained."""
        kept = (None,) * len(self.kept) if held is None else tuple(held[k] for k in self.kept)
        return kept + tuple(lay.out_sharding for lay, _ in self.groups) + (None,) * n_more

    def leaves(self, kept_leaves: list[Any], packs: list[Any], data_leaves: Callable[..., list]) -> list[Any]:
        """Every value's new leaf: ``kept_leaves`` and the members of ``packs`` (arrays, in group order)."""
        members: list[Any] = []
        for (lay, ks), array in zip(self.groups, packs):
            pack = Pack(array, lay)
            members += data_leaves(lay.keys, [pack] * len(ks), DATA)
        return list(map((kept_leaves + members).__getitem__, self.inverse))


# id(plan structure) -> (it, held, one device, Outputs or None, roots' places, config.pack_mesh_state)
_OUTPUTS: dict[int, tuple] = {}
_LAYOUTS: dict[tuple, Layout] = {}
MAX_BYTES = 1 << 20
"""A tensor larger than this (all its shards' bytes) is left out of packs. JAX's host work per array is
~2-4 us (``benchmarks/jax_array_costs.py``), about what a GPU takes to read 1 MiB: beyond that, the device's
work on the tensor outweighs the host's, and packing it would cost a copy of it on the sync that first
packs it (its old array and its pack both alive)."""


def outputs(struct: Any, outs: list[int], metas: list[tuple], held: tuple | None, one: Any,
            fed: Callable[[], list[bool]] = list) -> Outputs | None:
    """The packing of a sync's distinct values (``metas``: their (shape, dtype, ...)), or None: nothing to pack.

    A value's layout is known when a sync hook holds it in one (``held``, per value; None: none
    given: a sticky layout, which the value has from the step that makes it) or when the whole program
    runs on one device (``one``: its ``SingleDeviceSharding``); other values are left as they are.
    NOTE: not the layout of the leaf a value overwrites: new optimizer state has none in the step that
    makes it, so the next step would pack more than this one, and the step after would compile again.
    ``fed()``: per value, whether its storage's value before this step is a matrix operand in it
    (:func:`matrix_operands`): on a mesh such values are left out, asked for when the structure is new.
    Remembered per plan structure (``struct``) and roots' places in it (``outs``), which fix the values'
    shapes and dtypes.
    """
    mesh = config.pack_mesh_state
    hit = _OUTPUTS.get(id(struct))
    if hit is not None and hit[0] is struct and hit[2] is one and hit[5] is mesh and hit[4] == outs \
            and (hit[1] is held or hit[1] == held):
        return hit[3]
    if held is not None and held.count(None) != len(held):
        one = None  # the program lays values out on a mesh
    given = [one] * len(metas) if held is None else [one if h is None else h for h in held]
    if one is None and mesh:
        for k, f in enumerate(fed()):
            if f:
                given[k] = None
    laid = _grouped(given, metas)
    out = Outputs(len(metas), laid) if laid else None
    if len(_OUTPUTS) >= 64:
        _OUTPUTS.clear()
    _OUTPUTS[id(struct)] = (struct, held, one, out, list(outs), mesh)
    return out


def matrix_operands(order: list[Any]) -> set[int]:
    """The ids of the device-data leaves in ``order`` (a plan's nodes) that a matrix product or a convolution
    reads, directly or through views.

    NOTE: XLA fuses a member's slice of its pack into elementwise consumers, but a dot's operand is a buffer
    of its own: on a mesh a packed weight costs a copy kernel per step (on 8 CPU devices a 2x4 Megatron
    12-layer GPT's 73 weights made 73 more kernels, and its step 3-6 ms slower). Such tensors stay arrays of
    their own there. On one device the weights stay packed: left out, each needed a copy all the same (the
    step's new value written over the donated one it reads), and the step was ~1 ms slower. A weight cast
    first (``autocast``) is read by the cast, which fuses the slice.
    """
    products, views = _op_sets()
    out: set[int] = set()
    for n in order:
        if getattr(n.op, "overloadpacket", None) not in products:
            continue
        for x in n.inputs:
            while len(x.inputs) == 1 and (getattr(x.op, "overloadpacket", x.op) in views):
                x = x.inputs[0]
            if x.op == DATA and len(x.key[1]) >= 2:
                out.add(id(x))
    return out


@functools.cache
def _op_sets() -> tuple[frozenset, frozenset]:
    """(the ops whose matrix operands XLA does not fuse into them, the view ops looked through: aten's and
    the core's sharding constraint)."""
    import torch

    from xla_dtensor.core.layout import CONSTRAINT
    from xla_dtensor.ops.fused_linear import LINEAR, LINEAR_BACKWARD
    aten = torch.ops.aten
    products = frozenset({aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten.matmul, aten.linear, aten.einsum,
                          aten.convolution, aten.convolution_backward, aten._convolution,
                          LINEAR.overloadpacket, LINEAR_BACKWARD.overloadpacket})
    views = frozenset({aten.t, aten.transpose, aten.permute, aten.view, aten._unsafe_view, aten.reshape,
                       aten.expand, aten.alias, aten.detach, aten.unsqueeze, aten.squeeze, CONSTRAINT})
    return products, views


def _candidate(meta: tuple) -> bool:
    """Whether a value of metadata ``meta`` may be packed: not 0-d, not empty, at most :data:`MAX_BYTES`."""
    shape = meta[0]
    return bool(shape) and 0 < math.prod(shape) * meta[1].itemsize <= MAX_BYTES


def _grouped(given: list[Any], metas: list[tuple]) -> list[tuple[Layout, list[int]]]:
    """The packs of the candidates among values of ``metas`` in layouts ``given`` (None: left out)."""
    groups: dict[tuple, list[tuple]] = {}
    for k, (sh, meta) in enumerate(zip(given, metas)):
        if sh is None or not _candidate(meta):
            continue
        shape = tuple(meta[0])
        gk = _group_key(sh, shape)
        if gk is not None:
            groups.setdefault((meta[1], gk[0]), []).append((shape, gk[1], k))
    out = []
    for (dtype, gkey), members in groups.items():
        if len(members) < MIN_MEMBERS:
            continue
        # NOTE: members by shape and split, not by the values' order, which can differ from step to step with the
        # same tensors (the step that makes optimizer state makes it after the activations it keeps; the next
        # step's activations come after it): a pack of other order is another program
        members.sort()
        ks = [k for *_, k in members]
        out.append((_layout(dtype, gkey, [shape for shape, *_ in members], [given[k] for k in ks],
                            [split for _, split, _ in members]), ks))
    return out


def _group_key(sh: Any, shape: tuple[int, ...]) -> tuple | None:
    """(the pack's layout key, per dim the number of blocks) for a tensor of ``shape`` in ``sh``; None: not packable
    (a layout other than one device or an even ``NamedSharding`` split over mesh axes)."""
    if isinstance(sh, SingleDeviceSharding):
        return ("one", sh), (1,) * len(shape)
    if type(sh) is not NamedSharding or not config.pack_mesh_state:
        return None
    spec = sh.spec
    if getattr(spec, "unreduced", None) or getattr(spec, "reduced", None) or len(spec) > len(shape):
        return None
    sizes = dict(zip(sh.mesh.axis_names, sh.mesh.axis_sizes))
    axes: list[str] = []
    split = []
    for d in range(len(shape)):
        entry = spec[d] if d < len(spec) else None
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        k = math.prod(sizes[a] for a in names)
        if shape[d] % k:
            return None
        axes += names
        split.append(k)
    return ("mesh", sh.mesh, tuple(axes), sh.memory_kind), tuple(split)


def _layout(torch_dtype: Any, gkey: tuple, shapes: list[tuple], shardings: list[Any], splits: list[tuple]) -> Layout:
    """The layout of a pack of ``shapes`` in ``shardings`` (``splits``: theirs from :func:`_group_key`), one object
    per (dtype, group key, shapes, layouts)."""
    key = (torch_dtype, gkey, tuple(shapes), tuple(map(canonical, shardings)))
    lay = _LAYOUTS.get(key)
    if lay is None:
        if gkey[0] == "one":
            sharding, rows = gkey[1], 1
        else:
            _, mesh, axes, memory_kind = gkey
            rows = math.prod(dict(zip(mesh.axis_names, mesh.axis_sizes))[a] for a in axes)
            sharding = NamedSharding(mesh, PartitionSpec(axes if axes else None, None), memory_kind=memory_kind)
        if len(_LAYOUTS) >= 256:
            _LAYOUTS.clear()
        lay = _LAYOUTS[key] = Layout(to_jax(torch_dtype), sharding, rows, tuple(shapes), tuple(splits),
                                     tuple(shardings), torch_dtype)
    return lay


def one_device(struct: Any, leaves: list[Any]) -> Any:
    """The ``SingleDeviceSharding`` a plan's program runs on (remembered per structure), or None: every
    device-data leaf is there and no node is given a layout (a ``sharding_constraint`` lays a program of
    single-device arrays out on a mesh)."""
    hit = _ONE.get(id(struct))
    if hit is not None and hit[0] is struct:
        return hit[1]
    found = None
    laid = any(type(e) is tuple and len(e) == 3 for e in struct)  # (hash, wiring, sharding): a node's layout
    for n in [] if laid else leaves:
        if n.op != DATA:
            continue
        sh = n.key[3]
        if not isinstance(sh, SingleDeviceSharding) or (found is not None and sh != found):
            found = None
            break
        found = sh
    if len(_ONE) >= 64:
        _ONE.clear()
    _ONE[id(struct)] = (struct, found)
    return found


_ONE: dict[int, tuple] = {}


# ------------------------------------------------------------------------------------------- inputs


class Inputs:
    """A program's packed arguments: ``args`` are the arguments that are no pack member, in argument order,
    then each pack's array once (``packs``, in order of first use); ``sig`` (bytes) identifies the program's
    wiring: per member (its argument position, its pack's number, its index in the pack), then per pack
    ``id(layout)``, as int64. Made by :func:`split`."""

    __slots__ = ("args", "packs", "sig", "n")

    def __init__(self, args: list[Any], packs: list[Pack], sig: bytes, n: int) -> None:
        self.args, self.packs, self.sig, self.n = args, packs, sig, n  # n: the arguments, members included

    @property
    def at(self) -> list[tuple[int, int, int]]:
        """Per member: (its argument position, its pack's number, its index in the pack)."""
        codes = memoryview(self.sig).cast("q")
        m = (len(codes) - len(self.packs)) // 3
        return [(codes[3 * i], codes[3 * i + 1], codes[3 * i + 2]) for i in range(m)]

    @property
    def moved(self) -> list[int]:
        """Per argument: its position in :attr:`args` (-1: a pack member)."""
        members = {j for j, _, _ in self.at}
        out, k = [], 0
        for j in range(self.n):
            out.append(-1 if j in members else k)
            k += j not in members
        return out

    def donated(self, donate_idx: tuple[int, ...]) -> tuple[int, ...]:
        """The donated positions among :attr:`args`: ``donate_idx`` (argument positions, none a member's) moved.
        No pack is donated (:meth:`Layout.pack`)."""
        # NOTE: a member's position among them (a plan laid out when it was an array) is left out
        if not donate_idx:
            return ()
        moved = self.moved
        return tuple(k for k in map(moved.__getitem__, donate_idx) if k >= 0)

    def unpacked(self, args: tuple) -> list[Any]:
        """Every argument's value (traced) from :attr:`args`, each member sliced from its pack."""
        full = [None if k < 0 else args[k] for k in self.moved]
        m = len(self.args) - len(self.packs)
        for j, g, i in self.at:
            full[j] = self.packs[g].layout.unpack(args[m + g], i)
        return full


def _split_py(leaves: list[Any], pack_type: type) -> tuple[list[Any], list[Any], bytes] | None:
    """:func:`split`'s (args, packs, sig) in Python (the reference)."""
    raws = [leaf.raw for leaf in leaves]
    if pack_type not in map(type, raws):
        return None
    number: dict[int, int] = {}
    packs: list[Pack] = []
    args: list[Any] = []
    codes: list[int] = []
    for j, r in enumerate(raws):
        if type(r) is pack_type:
            g = number.get(id(r))
            if g is None:
                g = number[id(r)] = len(packs)
                packs.append(r)
            codes += (j, g, leaves[j].key[4])
        else:
            args.append(r)
    codes += [id(p.layout) for p in packs]
    return args + [p.array for p in packs], packs, array.array("q", codes).tobytes()


def split(leaves: list[Any]) -> Inputs | None:
    """The packed arguments of a program taking ``leaves`` (in argument order), or None: no leaf is a pack member."""
    got = NotImplemented if _SPLIT_C is None else _SPLIT_C(leaves, Pack)
    if got is NotImplemented:
        got = _split_py(leaves, Pack)
    return None if got is None else Inputs(*got, len(leaves))


_SPLIT_C = ir._native.MODULE.split_packs if ir._native.ON else None  # (~0.3 ms less a GPT step's sync, one pass)


def program(run: Callable[..., tuple], inputs: Inputs | None, outputs: Outputs | None) -> Callable[..., tuple]:
    """``run`` (a plan's program, its arguments in argument order) taking them with their packs (``inputs``) and
    returning its values packed (``outputs``)."""
    def packed(*args: Any) -> tuple:
        outs = run(*(args if inputs is None else inputs.unpacked(args)))
        if outputs is None:
            return outs
        n = len(outputs.inverse)
        made = [lay.pack([outs[k] for k in ks]) for lay, ks in outputs.groups]
        return tuple(outs[k] for k in outputs.kept) + tuple(made) + tuple(outs[n:])
    return packed
