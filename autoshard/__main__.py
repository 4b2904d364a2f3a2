"""Command line of autoshard: ``python -m autoshard {plan,iopddl} ...``.

``plan`` traces a GPT-2 training step (fake tensors), solves, prints the explained plan
and the baseline comparison, e.g. ``python -m autoshard plan --layers 12 --mesh 2x4
--topology tpu-v5e``. ``iopddl`` solves an IOPDDL contest instance
(``python -m autoshard iopddl FILE.json.gz``). Bad arguments end with one line on
stderr and exit code 2; progress lines go to stderr.
"""
from __future__ import annotations

import math
import sys
import time
from typing import Sequence

from mesh import _cli
from mesh._cli import OneLineParser, mesh_shape, nonnegative_int, output_file, positive_float, positive_int

PROG = "python -m autoshard"
MAX_DEVICES = 1 << 16   # larger than any pod; keeps a typo such as 2x40000x4 from building forever
MAX_AXES = 3            # mesh axes the planner accepts (size-1 axes count: each multiplies the strategies)
MAX_PAIRS = 20_000_000  # strategy pairs over all edges: ~6 us each to cost, ~2 min


def _add_plan(sub) -> None:  # noqa: ANN001
    from mesh import PRESETS

    p = sub.add_parser("plan", help="plan a GPT-2 training step and explain it",
                       description="Trace a GPT-2 training step on fake tensors (no memory), solve "
                                   "for a sharding of every tensor and explain the plan.")
    d = " (default: %(default)s)"
    p.add_argument("--model", default="gpt2", choices=["gpt2"], help="model to plan" + d)
    p.add_argument("--layers", type=positive_int, default=12, help="transformer blocks, >= 1" + d)
    p.add_argument("--d-model", type=positive_int, default=768, help="hidden size, a positive multiple of --heads" + d)
    p.add_argument("--heads", type=positive_int, default=12, help="attention heads, >= 1" + d)
    p.add_argument("--vocab", type=positive_int, default=50304, help="vocabulary size, >= 1" + d)
    p.add_argument("--batch", type=positive_int, default=8, help="global batch size, >= 1" + d)
    p.add_argument("--seq", type=positive_int, default=1024, help="sequence length, >= 1" + d)
    p.add_argument("--mesh", type=mesh_shape, default=(8,), metavar="SHAPE",
                   help=f"mesh shape such as 8, 2x4 or 2x2x2; at most {MAX_AXES} axes and "
                        f"{MAX_DEVICES} devices (default: 8)")
    p.add_argument("--dcn", type=positive_int, default=1,
                   help="granules (slices) along the first mesh axis, which then crosses DCN in a "
                        "HybridMesh; >= 1 and dividing that axis" + d)
    p.add_argument("--topology", default="tpu-v5e", choices=sorted(PRESETS),
                   help="system whose links and roofline are modelled" + d)
    p.add_argument("--memory-gib", type=positive_float, default=None, metavar="GIB",
                   help="per-device memory budget in GiB, a number > 0 (default: unlimited)")
    p.add_argument("--time-limit", type=positive_float, default=60.0, metavar="SECONDS",
                   help="solver wall-clock limit, a number > 0; on timeout the best plan found is used" + d)
    p.add_argument("--max-pairs", type=positive_int, default=MAX_PAIRS, metavar="N",
                   help="refuse a problem with more strategy pairs than this before building it "
                        "(costing each pair takes ~6 us), >= 1" + d)
    p.add_argument("--json", type=output_file, default=None, metavar="PATH",
                   help="also write the plan as JSON to PATH; its folder must exist (default: none)")
    p.add_argument("--rows", type=nonnegative_int, default=30, help="parameters shown in the table, >= 0" + d)
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr (default: off)")
    p.add_argument("--verbose", action="store_true", help="also the solver's own progress lines (default: off)")


def _add_iopddl(sub) -> None:  # noqa: ANN001
    from autoshard.solver.iopddl import add_arguments

    add_arguments(sub.add_parser("iopddl", help="solve an IOPDDL contest instance (.json or .json.gz)",
                                 description="Read an IOPDDL instance, solve it and print objective, "
                                             "bound, gap, time and status."))


def parser() -> OneLineParser:
    """The argument parser of ``python -m autoshard``."""
    p = OneLineParser(prog=PROG, description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True, metavar="{plan,iopddl}")
    _add_plan(sub)
    _add_iopddl(sub)
    return p


class _Id:
    """A device stand-in with only an id: plans describe a topology, not this machine."""

    __slots__ = ("id",)

    def __init__(self, i: int) -> None:
        self.id = i


def build_mesh(shape: tuple[int, ...], dcn: int):  # noqa: ANN201
    """A Mesh, or a HybridMesh whose first axis spans ``dcn`` granules (never checked
    against this machine's devices: the plan is for the topology)."""
    import mesh as m

    names = ("data", "model", "extra")[:len(shape)] if len(shape) <= 3 else None
    n = math.prod(shape)
    if dcn == 1:
        return m.Mesh(range(n), shape, names, validate=False)
    if shape[0] % dcn:
        raise ValueError(f"--dcn {dcn} must divide the first mesh axis {shape[0]}")
    ici = (shape[0] // dcn,) + shape[1:]
    return m.HybridMesh(ici_mesh_shape=ici, dcn_mesh_shape=(dcn,) + (1,) * (len(shape) - 1),
                        axis_names=names, num_granules=dcn, devices=[_Id(i) for i in range(n)],
                        validate=False)


def _check_plan_args(a) -> None:  # noqa: ANN001
    prog = f"{PROG} plan"
    if a.d_model % a.heads:
        _cli.fail(prog, f"argument --d-model: {a.d_model} is not a multiple of --heads {a.heads}")
    if math.prod(a.mesh) > MAX_DEVICES:
        _cli.fail(prog, f"argument --mesh: {'x'.join(map(str, a.mesh))} has {math.prod(a.mesh)} devices; "
                        f"at most {MAX_DEVICES}")
    if len(a.mesh) > MAX_AXES:
        squeezed = "x".join(str(n) for n in a.mesh if n > 1) or "1"
        _cli.fail(prog, f"argument --mesh: {'x'.join(map(str, a.mesh))} has {len(a.mesh)} axes; the planner "
                        f"takes at most {MAX_AXES} (each op has up to 5^axes strategies, size-1 axes "
                        f"included: a 4-axis GPT-2 step has ~10^8 strategy pairs, minutes to cost); drop "
                        f"size-1 axes ({squeezed}) or merge axes, e.g. 4x2x2")
    if a.mesh[0] % a.dcn:
        _cli.fail(prog, f"argument --dcn: {a.dcn} must divide the first mesh axis {a.mesh[0]}")


class _Progress:
    def __init__(self, quiet: bool) -> None:
        self.quiet, self.t0 = quiet, time.perf_counter()

    def __call__(self, msg: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def _plan(a) -> int:  # noqa: ANN001
    _check_plan_args(a)
    say = _Progress(a.quiet)
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autoshard.api import solve
    from autoshard.build import node_strategies
    from autoshard.fx_builder import trace_training_step
    from autoshard.models import GPT2, GPT2Config
    from autoshard.solver import MemoryBudgetError
    from mesh import topology_for

    cfg = GPT2Config(vocab=a.vocab, n_positions=a.seq, n_embd=a.d_model, n_layer=a.layers, n_head=a.heads)
    say(f"tracing GPT-2 {a.layers} layers x {a.d_model}, batch {a.batch} x {a.seq} (fake tensors)")
    with FakeTensorMode():
        model = GPT2(cfg)
        batch = torch.zeros(a.batch, a.seq, dtype=torch.long)
    graph = trace_training_step(model, (batch, batch), name=f"gpt2-{a.layers}x{a.d_model}")
    mesh = build_mesh(a.mesh, a.dcn)
    topo = topology_for(mesh, a.topology)
    if len(a.mesh) >= MAX_AXES:  # the only case that can come near the limit
        strats = node_strategies(graph, topo)[1]
        pairs = sum(len(strats[u]) * len(strats[n.id]) for n in graph.nodes for u, _ in n.inputs)
        say(f"{graph.num_nodes} ops, {pairs:,} strategy pairs (limit --max-pairs {a.max_pairs:,})")
        if pairs > a.max_pairs:
            _cli.fail(f"{PROG} plan", f"the problem has {pairs:,} strategy pairs, more than --max-pairs "
                                      f"{a.max_pairs:,} (~{pairs * 6e-6:.0f} s to build); use fewer mesh "
                                      "axes or layers, or raise --max-pairs")
    say(f"{graph.num_nodes} ops; building the ILP, scoring baselines, solving "
        f"(solver limit {a.time_limit:g} s)")
    budget = None if a.memory_gib is None else a.memory_gib * 2**30
    try:
        plan = solve(graph, mesh, topo, memory_budget=budget, time_limit=a.time_limit, verbose=a.verbose)
    except MemoryBudgetError as err:
        _cli.fail(f"{PROG} plan", f"argument --memory-gib: {err}")
    say(f"solved: {plan.status}")
    print(plan.explain(limit=a.rows))
    if a.json:
        try:
            a.json.write_text(plan.to_json())
        except OSError as err:
            _cli.fail(f"{PROG} plan", f"argument --json: cannot write {str(a.json)!r}: {err.strerror}",
                      usage_hint=False)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m autoshard``; returns the exit code."""
    args = parser().parse_args(argv)
    if args.cmd == "plan":
        return _plan(args)
    from autoshard.solver.iopddl import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
