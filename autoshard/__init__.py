"""autoshard: an Alpa-style ILP auto-sharder over a mesh topology, with explained plans.

The solver (:mod:`autoshard.solver`) is torch-free; the rest (tracing, strategies,
plans) loads on first use of its names, so ``import autoshard.solver`` pulls in no torch.

Example:
    >>> from autoshard import solve, trace_training_step  # doctest: +SKIP
    >>> plan = solve(trace_training_step(model, batch), mesh, "tpu-v5e")  # doctest: +SKIP
    >>> plan.explain()  # doctest: +SKIP
"""
from __future__ import annotations

import importlib

import mesh as _mesh  # noqa: F401  (virtual CPU devices before JAX starts)

# public name -> the module that defines it, imported on first access
_HOME = {
    "clear_cache": "autoshard.api", "solve": "autoshard.api",
    "BASELINES": "autoshard.baselines", "run_baselines": "autoshard.baselines",
    "Model": "autoshard.build", "PinError": "autoshard.build", "RuleFailedWarning": "autoshard.build",
    "UnknownOpWarning": "autoshard.build", "build_model": "autoshard.build",
    "fold_ties": "autoshard.fold",
    "graph_from_fx": "autoshard.fx_builder", "trace_training_step": "autoshard.fx_builder",
    "Graph": "autoshard.graph", "Node": "autoshard.graph", "TensorMeta": "autoshard.graph",
    "GPT2": "autoshard.models", "GPT2Config": "autoshard.models",
    "Decision": "autoshard.plan", "Plan": "autoshard.plan",
    "MemoryBudgetError": "autoshard.solver", "Problem": "autoshard.solver", "Solution": "autoshard.solver",
    "SolveStatus": "autoshard.solver", "evaluate": "autoshard.solver", "solve_problem": "autoshard.solver",
    "read_iopddl": "autoshard.solver",
    "Spec": "autoshard.spec", "parse_spec": "autoshard.spec", "partition_spec": "autoshard.spec",
    "spec_str": "autoshard.spec",
    "DimRule": "autoshard.strategies", "Strategy": "autoshard.strategies", "register": "autoshard.strategies",
    "registered_ops": "autoshard.strategies",
}


def __getattr__(name: str) -> object:
    if name not in _HOME:
        raise AttributeError(f"module 'autoshard' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))


__all__ = sorted(_HOME)
