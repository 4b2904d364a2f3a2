"""Reader for IOPDDL contest instances (google/iopddl JSON).

Format: ``{"problem": {"name", "nodes": {"intervals", "costs", "usages"},
"edges": {"nodes", "costs"}, "usage_limit"}}``; edge cost matrices are row-major
(``p * |S_v| + q``). The contest marks forbidden choices with a cost of 1e18; the
reader turns costs ``>= inf_cost`` into ``inf`` so the solver can remove them. Every
value is checked (costs and usages numbers >= 0, integer intervals with start <= end,
integer edge endpoints naming nodes) and the decompressed JSON is capped
(``max_bytes``, 1 GiB by default), so a bad or hostile file is an
:class:`IopddlFormatError`, never a wrong problem or an exhausted memory.

Command line (``python -m autoshard iopddl`` is the same command)::

    python -m autoshard.solver.iopddl asplos-2025-iopddl-B.json.gz --time-limit 60
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from autoshard.solver.problem import Problem

__all__ = ["read_iopddl", "IopddlFormatError", "MAX_BYTES", "add_arguments", "run", "main"]

PROG = "python -m autoshard iopddl"

CONTEST_INF = 1e18
MAX_BYTES = 1 << 30  # default cap on the decompressed JSON
_CHUNK = 1 << 20


class IopddlFormatError(ValueError):
    """The file is not a well-formed IOPDDL problem (or is larger than allowed)."""


def _read_capped(path: Path, max_bytes: int) -> bytes:
    opener = gzip.open if path.suffix == ".gz" else open
    parts, total = [], 0
    try:
        with opener(path, "rb") as f:
            while chunk := f.read(_CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise IopddlFormatError(
                        f"{path}: the JSON is larger than the limit of {max_bytes:,} bytes "
                        f"({max_bytes / 2**30:.3g} GiB) after decompression; pass a larger max_bytes "
                        "(command line: --max-gib) if the file is trusted")
                parts.append(chunk)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise IopddlFormatError(f"{path}: cannot read: {exc}") from None
    return b"".join(parts)


def _load_json(path: Path, max_bytes: int) -> dict:
    raw = _read_capped(path, max_bytes)
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and bad UTF-8 are ValueErrors
        raise IopddlFormatError(f"{path}: not valid JSON: {str(exc)[:200]}") from None
    if not isinstance(data, dict) or "problem" not in data:
        keys = list(data)[:5] if isinstance(data, dict) else []
        raise IopddlFormatError(f"{path}: expected a JSON object with key 'problem', "
                                f"got {type(data).__name__} with keys {keys}")
    return data["problem"]


def _numbers(rows: Any, what: str, inf_cost: float | None) -> list[np.ndarray]:
    """Each row a non-empty list of numbers >= 0; costs >= ``inf_cost`` become ``inf``."""
    if not isinstance(rows, list):
        raise IopddlFormatError(f"{what} must be a list of lists, got {type(rows).__name__}")
    out = []
    for i, r in enumerate(rows):
        try:
            a = np.asarray(r, dtype=np.float64)
        except (TypeError, ValueError):
            raise IopddlFormatError(f"{what}[{i}] must be a list of numbers, got {r!r:.80}") from None
        if a.ndim != 1 or a.size == 0:
            raise IopddlFormatError(f"{what}[{i}] must be a non-empty list of numbers, got {r!r:.80}")
        out.append(a)
    if not out:
        return out
    flat = np.concatenate(out)  # one vectorised check over every value
    bad = ~(flat >= 0)  # nan or negative
    if inf_cost is None:
        bad |= np.isinf(flat)
    if bad.any():
        k = int(np.argmax(bad))
        i = int(np.searchsorted(np.cumsum([a.size for a in out]), k, side="right"))
        j = k - sum(a.size for a in out[:i])
        allowed = "finite numbers >= 0" + ("" if inf_cost is None else f" (>= {inf_cost:g}: forbidden)")
        raise IopddlFormatError(f"{what}[{i}][{j}] = {rows[i][j]!r}; allowed: {allowed}")
    if inf_cost is not None:
        for a in out:
            a[a >= inf_cost] = math.inf
    return out


def _int_pairs(rows: Any, what: str) -> np.ndarray:
    """A list of ``[a, b]`` integer pairs as an ``(n, 2)`` int64 array."""
    if not isinstance(rows, list):
        raise IopddlFormatError(f"{what} must be a list of [a, b] pairs, got {type(rows).__name__}")
    if not rows:
        return np.zeros((0, 2), np.int64)
    try:
        a = np.asarray(rows)
    except (TypeError, ValueError):  # ragged
        a = None
    if (a is not None and a.dtype.kind == "i" and a.ndim == 2 and a.shape[1] == 2
            and not any(x is True or x is False for r in rows for x in r)):  # numpy reads true as 1
        return a.astype(np.int64, copy=False)
    for i, r in enumerate(rows):  # find the culprit
        if not (isinstance(r, list) and len(r) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in r)):
            raise IopddlFormatError(f"{what}[{i}] must be a pair of integers [a, b], got {r!r:.80}")
    raise IopddlFormatError(f"{what}: integers out of the int64 range")


def read_iopddl(path: str | Path, inf_cost: float | None = CONTEST_INF, *,
                max_bytes: int = MAX_BYTES) -> Problem:
    """Read a ``.json`` or ``.json.gz`` IOPDDL instance into a :class:`Problem`.

    Args:
        path: the instance file.
        inf_cost: costs at or above this become ``inf`` (None keeps them; then they must be finite).
        max_bytes: refuse a file whose (decompressed) JSON is larger than this.

    Example:
        >>> p = read_iopddl(Path(__file__).parents[1] / ".." / "shared" / "data"
        ...                 / "iopddl" / "example.json")  # doctest: +SKIP
        >>> p.num_nodes, p.memory_limit  # doctest: +SKIP
        (5, 50.0)

    Raises:
        IopddlFormatError: unreadable or oversized file, missing keys, inconsistent
            lengths, bad matrix sizes, or a value out of its allowed range.
    """
    path = Path(path)
    d = _load_json(path, max_bytes)
    try:
        nodes, edges = d["nodes"], d["edges"]
        intervals_raw, costs_raw, usages_raw = nodes["intervals"], nodes["costs"], nodes["usages"]
        edge_nodes, edge_costs_raw = edges["nodes"], edges["costs"]
    except (KeyError, TypeError) as exc:
        raise IopddlFormatError(f"{path}: missing key {exc} (need nodes.intervals/costs/usages, "
                                f"edges.nodes/costs)") from None
    costs = _numbers(costs_raw, f"{path}: nodes.costs", inf_cost)
    usages = _numbers(usages_raw, f"{path}: nodes.usages", None)
    iv = _int_pairs(intervals_raw, f"{path}: nodes.intervals")
    n = len(costs)
    if len(usages) != n or len(iv) != n:
        raise IopddlFormatError(f"{path}: {n} cost rows, {len(usages)} usage rows and "
                                f"{len(iv)} intervals; they must match")
    for v in range(n):
        if usages[v].shape != costs[v].shape:
            raise IopddlFormatError(f"{path}: node {v}: {costs[v].size} costs but {usages[v].size} usages")
    bad = np.flatnonzero((iv[:, 0] < 0) | (iv[:, 0] > iv[:, 1]))
    if bad.size:
        raise IopddlFormatError(f"{path}: nodes.intervals[{bad[0]}] = {iv[bad[0]].tolist()}; need "
                                "0 <= start <= end")
    ends = _int_pairs(edge_nodes, f"{path}: edges.nodes")
    if len(edge_costs_raw) != len(ends):
        raise IopddlFormatError(f"{path}: {len(ends)} edges but {len(edge_costs_raw)} cost matrices")
    out_of_range = np.flatnonzero(((ends < 0) | (ends >= n)).any(axis=1))
    if out_of_range.size:
        k = out_of_range[0]
        raise IopddlFormatError(f"{path}: edges.nodes[{k}] = {ends[k].tolist()}: endpoint out of range "
                                f"0..{n - 1}")
    edge_costs = _edge_matrices(path, _numbers(edge_costs_raw, f"{path}: edges.costs", inf_cost),
                                ends.tolist(), [c.size for c in costs])
    limit = d.get("usage_limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, (int, float))
                              or not (math.isfinite(limit) and limit >= 0)):
        raise IopddlFormatError(f"{path}: usage_limit = {limit!r}; allowed: a finite number >= 0 or null")
    return Problem(name=str(d.get("name", path.stem)), node_costs=costs, node_memory=usages,
                   intervals=[(int(a), int(b)) for a, b in iv.tolist()],
                   edges=[(int(u), int(v)) for u, v in ends.tolist()], edge_costs=edge_costs,
                   memory_limit=None if limit is None else float(limit))


def _edge_matrices(path: Path, flats: list[np.ndarray], ends: list[list[int]], ks: list[int]) -> list[np.ndarray]:
    out = []
    for k, (flat, (u, v)) in enumerate(zip(flats, ends)):
        if flat.size != ks[u] * ks[v]:
            raise IopddlFormatError(f"{path}: edge {k} ({u}, {v}): {flat.size} costs, expected "
                                    f"{ks[u]} x {ks[v]} = {ks[u] * ks[v]}")
        out.append(flat.reshape(ks[u], ks[v]))
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the IOPDDL command (also ``python -m autoshard iopddl``)."""
    from mesh._cli import positive_float, positive_int, readable_file

    d = " (default: %(default)s)"
    p.add_argument("file", type=readable_file, help="the instance, .json or .json.gz")
    p.add_argument("--time-limit", type=positive_float, default=60.0, metavar="SECONDS",
                   help="solver wall-clock limit, a number > 0" + d)
    p.add_argument("--solver", default="scip", choices=["scip", "highs", "cp_sat"], help="MIP backend" + d)
    p.add_argument("--max-gib", type=positive_float, default=MAX_BYTES / 2**30, metavar="GIB",
                   help="refuse files whose decompressed JSON is larger, a number > 0" + d)
    p.add_argument("--workers", type=positive_int, default=1,
                   help="search processes for big instances, one per core helps, >= 1" + d)
    p.add_argument("--quiet", action="store_true", help="no progress output (default: off)")


def run(args: argparse.Namespace) -> int:
    """Read, solve and print objective, bound, gap, time and status; returns the exit code."""
    from mesh._cli import fail

    from autoshard.solver._solve import solve_problem
    from autoshard.solver.evaluate import evaluate

    t0 = time.perf_counter()
    try:
        problem = read_iopddl(args.file, max_bytes=int(args.max_gib * 2**30))
    except IopddlFormatError as err:
        fail(PROG, str(err), usage_hint=False)
    print(f"read {problem.name}: {problem.num_nodes} nodes, {len(problem.edges)} edges "
          f"in {time.perf_counter() - t0:.2f} s", file=sys.stderr)
    sol = solve_problem(problem, time_limit=args.time_limit, verbose=not args.quiet,
                        mip_solver=args.solver, workers=args.workers)
    cost = feasible = None
    if sol.strategies is not None:
        cost, feasible, _ = evaluate(problem, sol.strategies)
    print(f"instance:  {problem.name}\nstatus:    {sol.status.value}\nobjective: {sol.objective:.10g}"
          f"\nbound:     {sol.bound:.10g}\ngap:       {sol.gap:.3%}\ntime:      {sol.solve_time:.2f} s"
          f"\nevaluated: {cost} (feasible={feasible})")
    return 0 if sol.strategies is not None else 1


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m autoshard.solver.iopddl``: read an instance, solve it, print objective, bound, gap."""
    from mesh._cli import OneLineParser

    p = OneLineParser(prog=PROG, description="Read an IOPDDL instance, solve it and print objective, "
                                             "bound, gap, time and status.")
    add_arguments(p)
    return run(p.parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
