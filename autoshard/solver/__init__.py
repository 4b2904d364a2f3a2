"""The strategy-selection solver: torch-free, usable without the rest of autoshard.

A :class:`Problem` (one strategy per node, node and edge costs, memory over liveness
intervals) is presolved, compacted and solved exactly by a MIP when small, else by an
anytime search with a Lagrangian bound (``design/AUTOSHARD.md``). The torch-facing
parts of :mod:`autoshard` (tracing, strategies, plans, explain) build problems and call
:func:`solve_problem`; nothing here imports them, torch, jax or xla_dtensor
(``tests/autoshard/test_solver_layering.py`` checks).

Example:
    >>> import numpy as np
    >>> from autoshard.solver import Problem, solve_problem
    >>> p = Problem("t", [np.array([1.0, 2.0]), np.array([0.0, 0.0])],
    ...             [np.zeros(2), np.zeros(2)], [(0, 1), (0, 1)], [(0, 1)],
    ...             [np.array([[5.0, 0.0], [0.0, 5.0]])], None)
    >>> solve_problem(p).objective
    1.0
"""
from __future__ import annotations

from autoshard.solver._presolve import InvalidProblemError
from autoshard.solver._solve import (MemoryBudgetError, Solution, SolverError, SolverTimeoutWarning,
                                     SolveStatus, solve_problem)
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.solver.problem import Problem


def __getattr__(name: str) -> object:
    # the reader loads on first use: importing autoshard.solver.iopddl here would make
    # ``python -m autoshard.solver.iopddl`` warn that the module was imported before it ran
    if name in ("read_iopddl", "IopddlFormatError"):
        from autoshard.solver import iopddl
        return getattr(iopddl, name)
    raise AttributeError(f"module 'autoshard.solver' has no attribute {name!r}")


__all__ = ["InvalidProblemError", "IopddlFormatError", "MemoryBudgetError", "Problem", "Solution",
           "SolverError", "SolverTimeoutWarning", "SolveStatus", "brute_force", "evaluate",
           "read_iopddl", "solve_problem"]
