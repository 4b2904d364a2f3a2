"""Command line: draw a sharding in the terminal.

Examples::

    python -m xla_dtensor.visualize "{devices=[2,4]<=[8]}" --shape 16,32
    python -m xla_dtensor.visualize "('dp', None, 'tp')" --shape 4,8,6 --mesh 2,4 --names dp,tp
    python -m xla_dtensor.visualize "{devices=[2,2,2]<=[8]}" --shape 4,8,6 --mesh 2,2,2 --dcn 2,1,1
"""
from __future__ import annotations

import argparse
import ast
import sys
from types import SimpleNamespace
from typing import Sequence

from rich.console import Console

from mesh import HybridMesh, Mesh
from mesh._cli import OneLineParser, fail, int_list, positive_int
from xla_dtensor.debug.visualize import visualize_sharding
from xla_dtensor.sharding import ShardingError
from xla_dtensor.sharding.hlo import MAX_DEVICES

PROG = "python -m xla_dtensor.visualize"


def _dims(text: str) -> tuple[int, ...]:
    try:
        dims = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two tensor dims like 0,1, got {text!r}") from None
    if len(dims) not in (1, 2) or any(d < 0 for d in dims) or len(set(dims)) != len(dims):
        raise argparse.ArgumentTypeError(f"expected one or two distinct dims >= 0 like 0,1, got {text!r}")
    return dims


def _width(text: str) -> int:
    n = positive_int(text)
    if n < 8:
        raise argparse.ArgumentTypeError(f"must be >= 8 characters, got {text!r}")
    return n


def _parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description="Draw how a sharding cuts a tensor across devices.")
    p.add_argument("sharding", help="an HLO sharding string such as '{devices=[2,4]<=[8]}', or a "
                                    "torch_xla partition spec such as \"('dp', None)\" (needs --mesh)")
    p.add_argument("--shape", type=int_list, required=True, help="global shape, sizes >= 1, e.g. 16,32")
    p.add_argument("--mesh", type=int_list, help="mesh shape, e.g. 2,4: devices 0..n-1 in order "
                                                 "(default: none; needed by partition specs)")
    p.add_argument("--names", help="mesh axis names, one per --mesh axis, e.g. dp,tp (default: dim0, dim1, ...)")
    p.add_argument("--dcn", type=int_list, help="make --mesh a HybridMesh with this DCN shape, one entry "
                                                "per axis dividing it (one simulated granule per DCN "
                                                "block; default: none)")
    p.add_argument("--dims", type=_dims, help="one or two distinct tensor dims to draw, each below "
                                            "the rank of --shape (default: 0,1)")
    p.add_argument("--width", type=_width, help="width in characters, >= 8 (default: the terminal's)")
    p.add_argument("--no-color", action="store_true", help="draw without colours (default: colours)")
    return p


def _mesh(args: argparse.Namespace) -> Mesh | None:
    if args.mesh is None:
        if args.names or args.dcn:
            fail(PROG, "--names and --dcn need --mesh")
        return None
    names = [n.strip() for n in args.names.split(",")] if args.names else None
    if names is not None and len(names) != len(args.mesh):
        fail(PROG, f"argument --names: {args.names!r} gives {len(names)} names for the "
                   f"{len(args.mesh)} axes of --mesh {','.join(map(str, args.mesh))}")
    n = _prod(args.mesh)
    if n > MAX_DEVICES:  # NOTE: checked before the device list is built
        fail(PROG, f"argument --mesh: {','.join(map(str, args.mesh))} is {n} devices, more than "
                   f"the {MAX_DEVICES} a drawing (or an HLO sharding) may hold")
    if not args.dcn:
        return Mesh(range(n), args.mesh, names, validate=False)  # drawing needs no devices
    if len(args.dcn) != len(args.mesh) or any(m % d for m, d in zip(args.mesh, args.dcn)):
        fail(PROG, f"argument --dcn: {','.join(map(str, args.dcn))} must have one entry per mesh axis, "
                   f"each dividing --mesh {','.join(map(str, args.mesh))}")
    ici = tuple(m // d for m, d in zip(args.mesh, args.dcn))
    devices = [SimpleNamespace(id=i) for i in range(n)]  # ids only: no JAX start needed
    return HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=args.dcn, axis_names=names,
                      devices=devices, num_granules=_prod(args.dcn), validate=False)


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _sharding(text: str) -> object:
    if text.lstrip().startswith("{"):
        return text
    try:
        spec = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        fail(PROG, f"argument sharding: {text!r} is neither an HLO sharding string ('{{...}}') nor a "
                   "partition spec tuple such as \"('dp', None)\"")
    return spec if isinstance(spec, tuple) else (spec,)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m xla_dtensor.visualize`` / ``xla-dtensor-visualize``.

    Bad input ends with one line on stderr and exit code 2.
    """
    args = _parser().parse_args(argv)
    m = _mesh(args)
    sharding = _sharding(args.sharding)
    if args.dims is not None and max(args.dims) >= len(args.shape):
        fail(PROG, f"argument --dims: {','.join(map(str, args.dims))} out of range for a "
                   f"{len(args.shape)}-D --shape (allowed 0..{len(args.shape) - 1})")
    try:
        visualize_sharding(sharding, args.shape, m, dims=args.dims, width=args.width,
                           color=not args.no_color, console=Console())
    except (ShardingError, ValueError, TypeError, KeyError) as err:  # mesh errors are ValueErrors too
        fail(PROG, str(err), usage_hint=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
