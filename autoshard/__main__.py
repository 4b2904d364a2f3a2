"""CLI: ``python -m autoshard plan --model gpt2 --layers 12 --mesh 2x4 --topology tpu-v5e``.

Traces a GPT-2 training step (fake tensors), solves, prints the explained plan and the
baseline comparison. ``--dcn 2`` makes the first mesh axis a DCN axis of a HybridMesh
(``--mesh 2x4 --dcn 2``: 2 slices x 4 chips). ``--json PATH`` also writes the plan.
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _mesh_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mesh must look like 8 or 2x4, got {text!r}") from None
    if not shape or any(n < 1 for n in shape):
        raise argparse.ArgumentTypeError(f"--mesh sizes must be positive, got {text!r}")
    return shape


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m autoshard", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    plan = sub.add_parser("plan", help="plan a GPT-2 training step and explain it")
    plan.add_argument("--model", default="gpt2", choices=["gpt2"])
    plan.add_argument("--layers", type=int, default=12)
    plan.add_argument("--d-model", type=int, default=768)
    plan.add_argument("--heads", type=int, default=12)
    plan.add_argument("--vocab", type=int, default=50304)
    plan.add_argument("--batch", type=int, default=8)
    plan.add_argument("--seq", type=int, default=1024)
    plan.add_argument("--mesh", type=_mesh_shape, default=(8,))
    plan.add_argument("--dcn", type=int, default=1, help="granules along the first mesh axis (HybridMesh)")
    plan.add_argument("--topology", default="tpu-v5e")
    plan.add_argument("--memory-gib", type=float, default=None, help="per-device memory budget")
    plan.add_argument("--time-limit", type=float, default=60.0)
    plan.add_argument("--json", default=None, help="write the plan as JSON here")
    plan.add_argument("--rows", type=int, default=30, help="parameters shown in the table")
    return p


def build_mesh(shape: tuple[int, ...], dcn: int):
    """A Mesh, or a HybridMesh whose first axis spans ``dcn`` granules."""
    import math

    import mesh as m

    names = ("data", "model", "extra")[:len(shape)] if len(shape) <= 3 else None
    n = math.prod(shape)
    if dcn == 1:
        return m.Mesh(range(n), shape, names)
    if shape[0] % dcn:
        raise SystemExit(f"--dcn {dcn} must divide the first mesh axis {shape[0]}")
    ici = (shape[0] // dcn,) + shape[1:]
    return m.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=(dcn,) + (1,) * (len(shape) - 1),
                        axis_names=names, num_granules=dcn)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoshard.api import solve
    from autoshard.fx_builder import trace_training_step
    from autoshard.models import GPT2, GPT2Config

    cfg = GPT2Config(vocab=args.vocab, n_positions=max(args.seq, 1), n_embd=args.d_model,
                     n_layer=args.layers, n_head=args.heads)
    with FakeTensorMode():
        model = GPT2(cfg)
        batch = torch.zeros(args.batch, args.seq, dtype=torch.long)
    graph = trace_training_step(model, (batch, batch), name=f"gpt2-{args.layers}x{args.d_model}")
    mesh = build_mesh(args.mesh, args.dcn)
    budget = None if args.memory_gib is None else args.memory_gib * 2**30
    plan = solve(graph, mesh, args.topology, memory_budget=budget, time_limit=args.time_limit)
    print(plan.explain(limit=args.rows))
    if args.json:
        with open(args.json, "w") as f:
            f.write(plan.to_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
