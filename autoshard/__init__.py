"""autoshard: an Alpa-style ILP auto-sharder over a mesh topology, with explained plans.

Example:
    >>> from autoshard import solve, trace_training_step  # doctest: +SKIP
    >>> plan = solve(trace_training_step(model, batch), mesh, "tpu-v5e")  # doctest: +SKIP
    >>> plan.explain()  # doctest: +SKIP
"""
from __future__ import annotations

import mesh as _mesh  # noqa: F401  (virtual CPU devices before JAX starts)

from autoshard.api import clear_cache, solve
from autoshard.baselines import BASELINES, run_baselines
from autoshard.build import Model, PinError, RuleFailedWarning, UnknownOpWarning, build_model
from autoshard.evaluate import evaluate
from autoshard.fold import fold_ties
from autoshard.fx_builder import graph_from_fx, trace_training_step
from autoshard.graph import Graph, Node, TensorMeta
from autoshard.models import GPT2, GPT2Config
from autoshard.plan import Decision, Plan
from autoshard.problem import Problem
from autoshard.solver import MemoryBudgetError, Solution, SolveStatus, solve_problem
from autoshard.spec import Spec, parse_spec, partition_spec, spec_str
from autoshard.strategies import DimRule, Strategy, register, registered_ops


def __getattr__(name: str) -> object:
    # read_iopddl loads on first use: importing autoshard.iopddl here would make
    # ``python -m autoshard.iopddl`` warn that the module was imported before it ran.
    if name == "read_iopddl":
        from autoshard.iopddl import read_iopddl
        return read_iopddl
    raise AttributeError(f"module 'autoshard' has no attribute {name!r}")


__all__ = [
    "BASELINES", "Decision", "DimRule", "GPT2", "GPT2Config", "Graph", "MemoryBudgetError", "Model",
    "Node", "PinError", "Plan", "Problem", "RuleFailedWarning", "Solution", "SolveStatus", "Spec", "Strategy",
    "TensorMeta",
    "UnknownOpWarning", "build_model", "clear_cache", "evaluate", "fold_ties", "graph_from_fx",
    "parse_spec", "partition_spec", "read_iopddl", "register", "registered_ops", "run_baselines",
    "solve", "solve_problem", "spec_str", "trace_training_step",
]
