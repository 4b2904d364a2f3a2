"""``ShardingSpec``: how a tensor of rank r is laid out on a :class:`mesh.Mesh`.

For every tensor dim the spec lists the mesh axes that split it, major first;
mesh axes used nowhere hold replicas; ``partial`` axes hold partial values that
are pending a reduction (DTensor's ``Partial``). This is the one value every other
form converts through:

===================== ===================================== ================================
form                  in                                    out
===================== ===================================== ================================
torch_xla spec        :meth:`ShardingSpec.from_partition_spec` :meth:`ShardingSpec.to_partition_spec`
DTensor placements    :meth:`ShardingSpec.from_placements`    :meth:`ShardingSpec.to_placements`
jax PartitionSpec     :meth:`ShardingSpec.from_jax`           :meth:`ShardingSpec.to_jax_pspec`
jax NamedSharding     :meth:`ShardingSpec.from_jax`           :meth:`ShardingSpec.to_named_sharding`
HLO sharding string   :meth:`ShardingSpec.from_hlo`           :meth:`ShardingSpec.to_hlo`
===================== ===================================== ================================
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING, Any, Sequence

from mesh import Mesh
from mesh.errors import AxisError

from xla_dtensor.sharding.errors import (
    DuplicateAxisError,
    PendingReductionError,
    RankError,
    SpecTypeError,
    UnknownAxisError,
)

if TYPE_CHECKING:  # pragma: no cover
    import jax

    from xla_dtensor.sharding.hlo import HloSharding

REDUCE_OPS = ("sum", "avg", "max", "min", "product")


@dataclass(frozen=True, slots=True)
class ShardingSpec:
    """A tensor layout on a mesh: for each tensor dim, the mesh axes splitting it.

    Args:
        mesh: the device mesh.
        dim_axes: one entry per tensor dim: a tuple of mesh axes (names or indices,
            major first) that split that dim; ``()`` leaves it whole. Stored as indices.
        partial: ``(mesh_axis, reduce_op)`` pairs for axes holding partial values
            pending a reduction (DTensor ``Partial``); stored with axis indices.

    Example:
        >>> from mesh import Mesh
        >>> m = Mesh(range(8), (2, 4), ("data", "model"))
        >>> spec = ShardingSpec(m, (("data",), ()))
        >>> spec.dim_axes, spec.replicated_axes, spec.shard_counts
        (((0,), ()), (1,), (2, 1))
        >>> spec.to_partition_spec()
        ('data', None)
    """

    mesh: Mesh
    dim_axes: tuple[tuple[int, ...], ...]
    partial: tuple[tuple[int, str], ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.mesh, Mesh):
            raise SpecTypeError(f"ShardingSpec needs a mesh.Mesh, got {type(self.mesh).__name__}")
        if isinstance(self.dim_axes, (str, bytes)) or not isinstance(self.dim_axes, Sequence):
            raise SpecTypeError(f"dim_axes must be a sequence with one tuple of mesh axes per "
                                f"tensor dim, got {self.dim_axes!r}")
        dims = tuple(_axes_tuple(self.mesh, entry, d) for d, entry in enumerate(self.dim_axes))
        partial = tuple(_partial_pair(self.mesh, p) for p in self.partial)
        _check_unique(self.mesh, dims, partial)
        object.__setattr__(self, "dim_axes", dims)
        object.__setattr__(self, "partial", partial)

    # -- derived facts --------------------------------------------------------------
    @property
    def ndim(self) -> int:
        """Rank of the tensor this spec lays out."""
        return len(self.dim_axes)

    @property
    def partial_axes(self) -> tuple[int, ...]:
        return tuple(a for a, _ in self.partial)

    @property
    def replicated_axes(self) -> tuple[int, ...]:
        """Mesh axes (indices, in mesh order) used neither for sharding nor as partial."""
        used = {a for axes in self.dim_axes for a in axes} | set(self.partial_axes)
        return tuple(a for a in range(self.mesh.ndim) if a not in used)

    @property
    def shard_counts(self) -> tuple[int, ...]:
        """How many pieces each tensor dim is cut into."""
        return tuple(prod(self.mesh.mesh_shape[a] for a in axes) for axes in self.dim_axes)

    @property
    def is_replicated(self) -> bool:
        """True when every device holds the whole (reduced) tensor."""
        return all(c == 1 for c in self.shard_counts) and not self.partial

    @property
    def is_partial(self) -> bool:
        """True when some mesh axes hold values pending a reduction."""
        return bool(self.partial)

    def reduced(self) -> ShardingSpec:
        """The layout after the pending reductions: partial axes become replicated."""
        return ShardingSpec(self.mesh, self.dim_axes)

    def on_root(self) -> ShardingSpec:
        """The same layout on the mesh a sub-mesh (``mesh["tp"]``) was cut from.

        Axes of the root mesh that the sub-mesh lacks hold replicas, which is what a
        placement on a DTensor sub-mesh means.
        """
        root, groups = self.mesh.root, self.mesh.root_axis_groups
        return ShardingSpec(root, tuple(tuple(r for a in d for r in groups[a]) for d in self.dim_axes),
                            tuple((r, op) for a, op in self.partial for r in groups[a]))

    @staticmethod
    def replicated(mesh: Mesh, ndim: int) -> ShardingSpec:
        """Fully replicated spec of rank ``ndim`` on ``mesh``."""
        return ShardingSpec(mesh, ((),) * ndim)

    # -- torch_xla partition specs ------------------------------------------------------
    @staticmethod
    def from_partition_spec(mesh: Mesh, partition_spec: Sequence[Any],
                            ndim: int | None = None) -> ShardingSpec:
        """Build from a torch_xla partition spec.

        Args:
            mesh: the mesh the spec's axes refer to.
            partition_spec: one entry per tensor dim: ``None``, a mesh axis (name or
                index), or a tuple of mesh axes (major first).
            ndim: the tensor's rank; when given the spec must have exactly that length.

        Example:
            >>> from mesh import Mesh
            >>> m = Mesh(range(8), (2, 4), ("x", "y"))
            >>> ShardingSpec.from_partition_spec(m, (("x", "y"), None)).shard_counts
            (8, 1)
        """
        if isinstance(partition_spec, (str, int)) or not isinstance(partition_spec, Sequence):
            raise SpecTypeError(f"a partition spec is a tuple with one entry per tensor dim, got "
                                f"{partition_spec!r}")
        entries = tuple(partition_spec)
        if ndim is not None and len(entries) != ndim:
            raise RankError(f"partition spec {entries!r} has {len(entries)} entries but the tensor "
                            f"has rank {ndim}; give one entry (None, an axis, or a tuple of axes) "
                            "per dim")
        return ShardingSpec(mesh, tuple(() if e is None else e for e in entries))

    def to_partition_spec(self) -> tuple[Any, ...]:
        """The torch_xla partition spec: axis names when the mesh has them, else indices.

        Raises:
            PendingReductionError: the spec has partial axes (call :meth:`reduced`).
        """
        self._require_no_partial("a torch_xla partition spec")
        names = self.mesh.axis_names
        out: list[Any] = []
        for axes in self.dim_axes:
            refs = tuple(names[a] if names else a for a in axes)
            out.append(None if not refs else refs[0] if len(refs) == 1 else refs)
        return tuple(out)

    # -- other forms, implemented in sibling modules -----------------------------------
    @staticmethod
    def from_placements(mesh: Mesh, placements: Sequence[Any], ndim: int) -> ShardingSpec:
        """Build from DTensor placements (one per mesh axis). See :mod:`.placements`."""
        from xla_dtensor.sharding.placements import spec_from_placements

        return spec_from_placements(mesh, placements, ndim)

    def to_placements(self) -> tuple[Any, ...]:
        """DTensor placements, one per mesh axis. See :mod:`.placements`."""
        from xla_dtensor.sharding.placements import spec_to_placements

        return spec_to_placements(self)

    @staticmethod
    def from_jax(sharding: Any, ndim: int, mesh: Mesh | None = None) -> ShardingSpec:
        """Build from a ``jax.sharding.NamedSharding`` or ``PartitionSpec``. See :mod:`.jax_interop`."""
        from xla_dtensor.sharding.jax_interop import spec_from_jax

        return spec_from_jax(sharding, ndim, mesh)

    def to_jax_pspec(self) -> "jax.sharding.PartitionSpec":
        """The ``jax.sharding.PartitionSpec`` (axis names as in ``mesh.jax_mesh()``)."""
        from xla_dtensor.sharding.jax_interop import spec_to_jax_pspec

        return spec_to_jax_pspec(self)

    def to_named_sharding(self) -> "jax.sharding.NamedSharding":
        """The ``jax.sharding.NamedSharding`` on ``mesh.jax_mesh()``."""
        from jax.sharding import NamedSharding

        return NamedSharding(self.mesh.jax_mesh(), self.to_jax_pspec())

    @staticmethod
    def from_hlo(sharding: "str | HloSharding", mesh: Mesh | None = None,
                 ndim: int | None = None) -> ShardingSpec:
        """Build from an HLO sharding (string or :class:`HloSharding`). See :mod:`.hlo_mesh`."""
        from xla_dtensor.sharding.hlo_mesh import spec_from_hlo

        return spec_from_hlo(sharding, mesh, ndim)

    def to_hlo(self) -> "HloSharding":
        """The :class:`HloSharding`; ``str(spec.to_hlo())`` is the HLO sharding string."""
        from xla_dtensor.sharding.hlo_mesh import spec_to_hlo

        return spec_to_hlo(self)

    def _require_no_partial(self, form: str) -> None:
        if self.partial:
            names = {self.mesh.axis_name(a): op for a, op in self.partial}
            raise PendingReductionError(
                f"spec has partial (pending-reduction) mesh axes {names}; {form} cannot hold a "
                "pending reduction. Reduce first and use spec.reduced() (partial axes replicated)")

    def __repr__(self) -> str:
        names = self.mesh.axis_names
        ref = (lambda a: repr(names[a])) if names else repr
        dims = ", ".join("None" if not axes else ref(axes[0]) if len(axes) == 1
                         else "(" + ", ".join(ref(a) for a in axes) + ")" for axes in self.dim_axes)
        part = (", partial={" + ", ".join(f"{ref(a)}: {op!r}" for a, op in self.partial) + "}"
                if self.partial else "")
        return f"ShardingSpec([{dims}]{part}; {self.mesh!r})"


# -- validation helpers ----------------------------------------------------------------
def _axis(mesh: Mesh, ref: Any, where: str) -> int:
    if isinstance(ref, bool) or not isinstance(ref, (str, int)) and not hasattr(ref, "__index__"):
        raise SpecTypeError(f"{where}: mesh axis must be a name (str) or an index (int), got "
                            f"{ref!r} of type {type(ref).__name__}")
    try:
        return mesh.axis_index(ref if isinstance(ref, str) else int(ref))
    except AxisError:
        allowed = list(mesh.axis_names or range(mesh.ndim))
        raise UnknownAxisError(f"{where}: unknown mesh axis {ref!r}; the mesh has axes {allowed}"
                               + ("" if mesh.axis_names else f" (indices -{mesh.ndim}..{mesh.ndim - 1})")
                               ) from None


def _axes_tuple(mesh: Mesh, entry: Any, dim: int) -> tuple[int, ...]:
    if entry is None:
        return ()
    refs = tuple(entry) if isinstance(entry, (tuple, list)) else (entry,)
    return tuple(_axis(mesh, r, f"tensor dim {dim}") for r in refs)


def _partial_pair(mesh: Mesh, pair: Any) -> tuple[int, str]:
    if not isinstance(pair, (tuple, list)) or len(pair) != 2:
        raise SpecTypeError(f"partial entries are (mesh_axis, reduce_op) pairs, got {pair!r}")
    axis, op = pair
    if op not in REDUCE_OPS:
        raise SpecTypeError(f"partial reduce op {op!r} on axis {axis!r} is not one of {REDUCE_OPS}")
    return _axis(mesh, axis, "partial"), op


def _check_unique(mesh: Mesh, dims: tuple[tuple[int, ...], ...],
                  partial: tuple[tuple[int, str], ...]) -> None:
    seen: dict[int, str] = {}
    for d, axes in enumerate(dims):
        for a in axes:
            _claim(mesh, seen, a, f"tensor dim {d}")
    for a, _ in partial:
        _claim(mesh, seen, a, "partial")


def _claim(mesh: Mesh, seen: dict[int, str], axis: int, user: str) -> None:
    if axis in seen:
        where = "twice in " + user if seen[axis] == user else f"by both {seen[axis]} and {user}"
        raise DuplicateAxisError(f"mesh axis {mesh.axis_name(axis)!r} is used {where}; each mesh "
                                 f"axis may split at most one tensor dim, once (mesh axes: "
                                 f"{list(mesh.shape())})")
    seen[axis] = user
