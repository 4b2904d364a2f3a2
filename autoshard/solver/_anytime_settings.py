"""The tuned numbers of :class:`autoshard.solver._anytime.AnytimeSearch` and its result.

Each field of :class:`AnytimeSettings` carries the reason for its value; how they were
measured is in docs/autoshard.md ("Runs and workers").
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

__all__ = ["AnytimeSettings", "AnytimeResult"]


@dataclass(frozen=True, slots=True)
class AnytimeSettings:
    """The tuned numbers of :class:`AnytimeSearch`, each with the reason for its value."""

    exact_entries: int = 150_000    # a fixed problem this small is solved by the MIP (as the exact path)
    bound_share: float = 0.15       # dual's share of a chunk pair while the bound creeps
    hot_share: float | None = None  # ... while it rises fast; None: 0.85 with workers (they search), else 0.6
    hot_rate: float = 0.02          # a dual chunk closing 2% of the gap counts as rising fast (M)
    near_gap: float = 0.03          # within 3% of the bound only polishing gains (M after its kernel jump)
    # kernels by the MIP near the bound, in turn while one finds nothing: (best by score,
    # best by the dual's costs per node, least and most seconds). M: 1 + 2 (10,164
    # strategies) finds its memory trade in 10 s at a bound of 4.935e10, not at 4.940e10;
    # 2 + 2 (12,622) takes 30-45 s
    deep_kernels: tuple[tuple[int, int, float, float], ...] = ((1, 2, 10.0, 30.0), (2, 2, 30.0, math.inf))
    every: float = 5.0              # seconds between progress lines
    restart_after: float | None = None  # stall that ends a run; None: limit/20, at least 15 s
    restart_share: float = 0.05     # V's runs reach their plan in 2-15 s, then find nothing
    restart_min: float = 15.0
    chunk: float | None = None      # search chunk; None: 12% of the limit within [10, 20] s
    chunk_share: float = 0.12
    chunk_range: tuple[float, float] = (10.0, 20.0)  # long enough to climb, short for the dual
    max_budget: int = 200_000       # largest LNS sub-problem (variables)
    run_budget: int = 3000          # LNS size a new run starts from (~0.5 s sub-solves on V)
    max_elite: int = 8              # run ends merged at once: 654 strategies on V, 0.1 s
    merge_share: float = 0.05       # time of a merge: 5% of the limit, at least 2 s
    merge_min: float = 2.0
    first_dual_share: float | None = None  # first bound and kernel ranking; None: 3% of the limit
    #   alone, 20% with workers (they search from the start; M's jump waits for the bound)
    first_dual_max: float | None = None    # ... at most 10 s alone, 20 s with workers
    first_rate: float = 0.01        # a slice closing 1% of the gap extends it (M: 1.9%, then 0.9% at 4.937e10)
    first_cap: float = 0.4          # at most 40% of the limit (M's bound 4.92e10 takes 21 s alone)
    first_cap_max: float = 36.0     # and 36 s: M at 180 s with 50 s of it ended 4.9929e10 twice
    reserve_share: float = 0.1      # the deep kernel leaves 10% of the limit to the polish after it
    kernel_strategies: int = 2      # per node in the dual-cost kernels: 3-6 are not solved in 30 s on M
    polish_jump: float = 0.01       # a kernel moving the plan 1% gets a full search chunk next
    worker_seed_stride: int = 1009  # workers' seeds: seed + 1009 i (primes keep the streams apart)
    chunk_seed_stride: int = 7919   # a new seed per search chunk
    kernel_seed_stride: int = 31    # and per hot kernel
    deep_seed_offset: int = 97      # the deep kernel's MIP seed
    worker_nice: int = 10           # workers yield the CPU to this process's dual (M's jump waits on it)
    dual_alpha: float = 0.0625      # first price step size: M's bound at 800 sweeps 4.90e10 (1.0: 4.80e10)
    dual_target_gap: float = 0.2    # Polyak target at most 20% above the bound (not the start plan's 3x)


@dataclass
class AnytimeResult:
    x: np.ndarray
    objective: float
    bound: float
    optimal: bool
    trace: list[tuple[float, float]]          # (seconds, incumbent)
    bound_trace: list[tuple[float, float]]    # (seconds, bound)
    stats: dict = field(default_factory=dict)
