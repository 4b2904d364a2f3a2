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
from xla_dtensor.debug.visualize import visualize_sharding
from xla_dtensor.sharding import ShardingError


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated ints like 16,32, got {text!r}")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m xla_dtensor.visualize",
                                description="Draw how a sharding cuts a tensor across devices.")
    p.add_argument("sharding", help="an HLO sharding string such as '{devices=[2,4]<=[8]}', or a "
                                    "torch_xla partition spec such as \"('dp', None)\" (needs --mesh)")
    p.add_argument("--shape", type=_ints, required=True, help="global shape, e.g. 16,32")
    p.add_argument("--mesh", type=_ints, help="mesh shape, e.g. 2,4 (devices 0..n-1 in order)")
    p.add_argument("--names", help="mesh axis names, e.g. dp,tp")
    p.add_argument("--dcn", type=_ints, help="make --mesh a HybridMesh with this DCN shape "
                                             "(one simulated granule per DCN block)")
    p.add_argument("--dims", type=_ints, help="the two tensor dims to draw (default 0,1)")
    p.add_argument("--width", type=int, help="width in characters (default: the terminal's)")
    p.add_argument("--no-color", action="store_true", help="draw without colours")
    return p


def _mesh(args: argparse.Namespace) -> Mesh | None:
    if args.mesh is None:
        if args.names or args.dcn:
            raise SystemExit("--names and --dcn need --mesh")
        return None
    names = args.names.split(",") if args.names else None
    n = 1
    for s in args.mesh:
        n *= s
    if not args.dcn:
        return Mesh(range(n), args.mesh, names)
    if len(args.dcn) != len(args.mesh) or any(m % d for m, d in zip(args.mesh, args.dcn)):
        raise SystemExit(f"--dcn {args.dcn} must have one entry per mesh axis, each dividing "
                         f"--mesh {args.mesh}")
    ici = tuple(m // d for m, d in zip(args.mesh, args.dcn))
    devices = [SimpleNamespace(id=i) for i in range(n)]  # ids only: no JAX start needed
    return HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=args.dcn, axis_names=names,
                      devices=devices, num_granules=_prod(args.dcn))


def _prod(xs: Sequence[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m xla_dtensor.visualize`` / ``xla-dtensor-visualize``."""
    args = _parser().parse_args(argv)
    try:
        m = _mesh(args)
        sharding: object = args.sharding
        if not args.sharding.lstrip().startswith("{"):
            try:
                sharding = ast.literal_eval(args.sharding)
            except (ValueError, SyntaxError):
                raise SystemExit(f"{args.sharding!r} is neither an HLO sharding string ('{{...}}') "
                                 "nor a partition spec tuple such as \"('dp', None)\"")
            if not isinstance(sharding, tuple):
                sharding = (sharding,)
        visualize_sharding(sharding, args.shape, m, dims=args.dims, width=args.width,
                           color=not args.no_color, console=Console())
    except (ShardingError, ValueError) as err:  # mesh errors are ValueErrors too
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
