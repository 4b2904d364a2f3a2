"""The table of layouts the round-trip tests check against JAX.

Each case names a mesh, a torch_xla partition spec, the ``jax.sharding.PartitionSpec``
written by hand for the same layout, and an evenly divisible global shape.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mesh  # noqa: F401  (8 virtual CPU devices before JAX starts)
from jax.sharding import PartitionSpec as P

from mesh import HybridMesh, Mesh

MESHES: dict[str, Mesh] = {
    "x8": Mesh(range(8), (8,), ("x",)),
    "ab24": Mesh(range(8), (2, 4), ("a", "b")),
    "ab42": Mesh(range(8), (4, 2), ("a", "b")),
    "abc222": Mesh(range(8), (2, 2, 2), ("a", "b", "c")),
    "unnamed24": Mesh(range(8), (2, 4)),
    "perm24": Mesh([3, 1, 2, 0, 7, 5, 6, 4], (2, 4), ("a", "b")),
    "sub4": Mesh(range(8), (2, 4), ("a", "b"))["b"],
    # granules [0..3] and [4..7] side by side along axis 1 -> ids [[0,1,4,5],[2,3,6,7]]
    "hybrid": HybridMesh(ici_mesh_shape=(2, 2), dcn_mesh_shape=(1, 2), axis_names=("a", "b"),
                         num_granules=2),
    "hybrid3": HybridMesh(ici_mesh_shape=(1, 2, 2), dcn_mesh_shape=(2, 1, 1),
                          axis_names=("dp", "fsdp", "tp"), num_granules=2),
}


@dataclass(frozen=True)
class Case:
    mesh: str
    spec: tuple[Any, ...]  # torch_xla partition spec
    pspec: Any             # the same layout as a jax PartitionSpec
    shape: tuple[int, ...]

    @property
    def id(self) -> str:
        return f"{self.mesh}-{self.spec}-{self.shape}"


CASES = [
    Case("x8", ("x",), P("x"), (16,)),
    Case("x8", (None, "x"), P(None, "x"), (3, 16)),
    Case("x8", ("x", None), P("x"), (8, 5)),
    Case("x8", (None,), P(), (4,)),
    Case("x8", (None, None, "x"), P(None, None, "x"), (2, 3, 8)),
    Case("ab24", ("a", "b"), P("a", "b"), (4, 8)),
    Case("ab24", ("b", "a"), P("b", "a"), (8, 4)),
    Case("ab24", (None, "b"), P(None, "b"), (3, 8)),
    Case("ab24", ("a", None), P("a", None), (4, 3)),
    Case("ab24", (("a", "b"),), P(("a", "b")), (16,)),
    Case("ab24", (("b", "a"),), P(("b", "a")), (16,)),
    Case("ab24", (("a", "b"), None), P(("a", "b"), None), (8, 2)),
    Case("ab24", (None, ("b", "a")), P(None, ("b", "a")), (2, 8)),
    Case("ab24", ("b", None, "a"), P("b", None, "a"), (4, 3, 2)),
    Case("ab24", (None, None), P(), (2, 2)),
    Case("ab24", ("a",), P("a"), (4,)),
    Case("ab24", (None, "a", None), P(None, "a"), (3, 2, 5)),
    Case("ab42", ("a", "b"), P("a", "b"), (8, 4)),
    Case("ab42", ("b", None), P("b"), (2, 3)),
    Case("ab42", (("b", "a"), None, None), P(("b", "a")), (8, 1, 1)),
    Case("ab42", (None, "a", "b"), P(None, "a", "b"), (1, 4, 2)),
    Case("abc222", ("a", "b", "c"), P("a", "b", "c"), (2, 4, 6)),
    Case("abc222", ("c", "a", "b"), P("c", "a", "b"), (2, 2, 2)),
    Case("abc222", (("c", "a"), "b"), P(("c", "a"), "b"), (4, 2)),
    Case("abc222", ("c", None), P("c"), (2, 3)),
    Case("abc222", (("b", "a"), None), P(("b", "a")), (4, 3)),
    Case("abc222", ("b", "c"), P("b", "c"), (2, 2)),
    Case("abc222", (None, ("a", "c")), P(None, ("a", "c")), (3, 4)),
    Case("abc222", (("a", "b", "c"),), P(("a", "b", "c")), (8,)),
    Case("abc222", ("b", None, None, "a"), P("b", None, None, "a"), (2, 1, 3, 2)),
    Case("unnamed24", (0, 1), P("dim0", "dim1"), (2, 4)),
    Case("unnamed24", (1, None), P("dim1"), (4, 3)),
    Case("unnamed24", ((1, 0),), P(("dim1", "dim0")), (8,)),
    Case("unnamed24", (None, 0), P(None, "dim0"), (5, 2)),
    Case("perm24", ("a", "b"), P("a", "b"), (2, 4)),
    Case("perm24", ("b", None), P("b"), (4, 2)),
    Case("perm24", (("b", "a"),), P(("b", "a")), (8,)),
    Case("sub4", ("b", None), P("b"), (4, 2)),
    Case("hybrid", ("a", "b"), P("a", "b"), (2, 4)),
    Case("hybrid", (None, "b"), P(None, "b"), (3, 4)),
    Case("hybrid", (("b", "a"),), P(("b", "a")), (8,)),
    Case("hybrid3", ("dp", ("fsdp", "tp")), P("dp", ("fsdp", "tp")), (2, 4)),
    Case("hybrid3", (("tp", "dp"), None, "fsdp"), P(("tp", "dp"), None, "fsdp"), (4, 3, 2)),
]
