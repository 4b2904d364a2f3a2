"""``jax.sharding.PartitionSpec`` / ``NamedSharding`` <-> :class:`ShardingSpec`.

JAX names mesh axes by ``mesh.jax_axis_names`` (``"dim{i}"`` on an unnamed mesh) and
lets a ``PartitionSpec`` be shorter than the tensor's rank (missing dims are whole).
"""
from __future__ import annotations

from typing import Any

from mesh import Mesh

from xla_dtensor.sharding.errors import NotExpressibleError, RankError, SpecTypeError
from xla_dtensor.sharding.spec import ShardingSpec


def mesh_from_jax(jax_mesh: Any) -> Mesh:
    """The :class:`mesh.Mesh` with the same device ids, order and axis names as a JAX mesh.

    Axis names ``dim0, dim1, ...`` (what an unnamed :class:`mesh.Mesh` is called in JAX)
    give an unnamed mesh.
    """
    ids = [d.id for d in jax_mesh.devices.reshape(-1)]
    names = tuple(jax_mesh.axis_names)
    unnamed = names == tuple(f"dim{i}" for i in range(len(names)))
    return Mesh(ids, jax_mesh.devices.shape, None if unnamed else names)


def spec_from_jax(sharding: Any, ndim: int, mesh: Mesh | None = None) -> ShardingSpec:
    """Build a spec from a ``NamedSharding`` (its mesh is used) or a ``PartitionSpec`` (+ ``mesh``).

    Example:
        >>> import mesh
        >>> from jax.sharding import PartitionSpec as P
        >>> m = mesh.Mesh(range(8), (2, 4), ("x", "y"))
        >>> spec_from_jax(P(None, ("y", "x")), 2, m).to_partition_spec()
        (None, ('y', 'x'))
    """
    from jax.sharding import NamedSharding, PartitionSpec

    if isinstance(sharding, NamedSharding):
        own = mesh_from_jax(sharding.mesh)
        if mesh is not None and (mesh.device_ids, mesh.mesh_shape, mesh.jax_axis_names) != \
                (own.device_ids, own.mesh_shape, own.jax_axis_names):
            raise NotExpressibleError(f"the NamedSharding's mesh {own!r} differs from the given "
                                      f"mesh {mesh!r}; pass mesh=None to use the sharding's own")
        target, pspec = mesh or own, sharding.spec
    elif isinstance(sharding, PartitionSpec):
        if mesh is None:
            raise SpecTypeError("a bare PartitionSpec needs mesh=...; a NamedSharding carries its own")
        target, pspec = mesh, sharding
    else:
        raise SpecTypeError(f"expected a jax NamedSharding or PartitionSpec, got "
                            f"{type(sharding).__name__}: {sharding!r}")
    if getattr(pspec, "unreduced", None) or getattr(pspec, "reduced", None):
        raise NotExpressibleError(f"{pspec!r} has unreduced/reduced axes; only plain specs convert")
    entries = tuple(pspec)
    if len(entries) > ndim:
        raise RankError(f"PartitionSpec {pspec!r} has {len(entries)} entries for a rank-{ndim} "
                        "tensor (allowed: at most one per dim)")
    names = target.jax_axis_names
    entries += (None,) * (ndim - len(entries))
    dims = []
    for e in entries:
        refs = () if e is None else tuple(e) if isinstance(e, (tuple, list)) else (e,)
        dims.append(tuple(names.index(r) if isinstance(r, str) and r in names else r for r in refs))
    return ShardingSpec(target, tuple(dims))


def spec_to_jax_pspec(spec: ShardingSpec) -> Any:
    """The ``jax.sharding.PartitionSpec`` of ``spec`` (full length, axis names of the JAX mesh).

    Example:
        >>> import mesh
        >>> m = mesh.Mesh(range(8), (2, 4), ("x", "y"))
        >>> spec_to_jax_pspec(ShardingSpec(m, (("y", "x"), ())))
        P(('y', 'x'), None)
    """
    from jax.sharding import PartitionSpec

    spec._require_no_partial("a jax PartitionSpec")
    names = spec.mesh.jax_axis_names
    out: list[Any] = []
    for axes in spec.dim_axes:
        refs = tuple(names[a] for a in axes)
        out.append(None if not refs else refs[0] if len(refs) == 1 else refs)
    return PartitionSpec(*out)
