"""Anytime search on a :class:`~autoshard.solver._compact.Compact` problem: large-neighbourhood
search with exact sub-solves, node moves, and memory prices.

Every accepted step keeps the plan within the memory limit and lowers the cost (the
moves are in :mod:`autoshard.solver._moves`):
1. *node and pair moves* (vectorized best response of single nodes and of both ends of
   every edge) until none improves;
2. *forest DP*: the exact best plan of a random induced forest, memory priced;
3. *LNS*: a BFS ball, a ball around an expensive edge, a window of the liveness timeline
   (rows near the limit), or a four times larger ball over each node's best three
   strategies, re-solved exactly by the MIP, memory included. The size adapts to about
   ``step_time`` seconds per sub-solve. Once per plan, the window turn instead takes
   every node holding memory on the rows at the limit, over each one's best few
   strategies (two, one more after each exact solve that finds nothing);
4. after 4 steps without a gain, the *kernel*: the whole problem over each node's
   current strategy and its best few by score and by the dual's reparametrized cost
   ``theta``; when a kernel has failed on the plan, once the *memory exchange*
   (:mod:`autoshard.solver._exchange`: a blocked cheaper move paid for by a hub's chain);
5. *restarts* (kicks): after a long stretch without improvement, a random region of the
   best plan is re-drawn (seeded); the best plan is kept.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from autoshard.solver._compact import Compact
from autoshard.solver._exchange import exchange_move
from autoshard.solver._moves import (best_few, costly_node, Prices, State, dp_move, kernel_move,
                              lns_move, node_moves, pair_moves)
from autoshard.solver._neighbourhood import ball, binding, window
from autoshard.solver._space import Space

__all__ = ["search", "SearchResult", "LocalSearch"]

_KERNEL_AFTER = 4       # steps without a gain before a kernel move (local neighbourhoods stall)
_BIG_BALL = 4           # the restricted LNS ball is this many times the budget
_KICK_SHARE = 0.15      # a kick after this share of the limit (at least 10 s) without a gain ...
_KICK_MIN = 10.0
_KICK_LEFT = 0.2        # ... when at least this share of the limit is left


@dataclass
class SearchResult:
    x: np.ndarray
    objective: float
    trace: list[tuple[float, float]]          # (seconds, incumbent) at every improvement
    stats: dict = field(default_factory=dict)


class LocalSearch:
    """One search from the feasible compact plan ``x0``; :meth:`run` returns its result.

    See :func:`search` for the parameters.
    """

    def __init__(self, compact: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
                 bound: Callable[[], float] | None = None, log: Callable[[str], None] | None = None,
                 every: float = 5.0, step_time: float = 0.5, budget: int = 3000,
                 space: Space | None = None, theta: Callable[[], np.ndarray | None] | None = None,
                 stop_at: float = -math.inf, max_budget: int = 200_000,
                 kicks: bool = True, stall: float = math.inf) -> None:
        self.t0 = time.perf_counter()
        self.time_limit, self.deadline = time_limit, self.t0 + time_limit
        self.space = Space(compact) if space is None else space
        self.state = State(self.space, x0)
        self.rng = np.random.default_rng(seed)
        self.prices = Prices(self.space)
        self.bound, self.log, self.every, self.step_time = bound, log, every, step_time
        self.budget, self.max_budget, self.theta = budget, max_budget, theta
        self.stop_at, self.kicks, self.stall = stop_at, kicks, stall
        self.best_x, self.best = self.state.x.copy(), self.state.obj
        self.trace = [(0.0, self.best)]
        self.stats = dict(node_moves=0, pair_moves=0, dp=0, dp_better=0, lns=0, lns_better=0,
                          lns_optimal=0, restarts=0, kernel=0, kernel_better=0, binding=0,
                          binding_better=0, exchange=0, exchange_better=0)
        self.kernel_size, self.since_gain = 2, 0
        self.binding_size, self.binding_tried = 2, None  # strategies per node; (plan, size) last tried
        self.kernel_tried = self.exchange_tried = None  # objective of the plan each last tried
        self.last_log, self.last_gain = self.t0 - every, self.t0  # first line right away

    def run(self) -> SearchResult:
        self.descend()
        self.note()
        step = 0
        while (time.perf_counter() < self.deadline and self.best > self.stop_at
               and time.perf_counter() - self.t0 - self.trace[-1][0] < self.stall):  # since a gain
            step += 1
            self.progress()
            if self.since_gain >= _KERNEL_AFTER:
                if (self.state.U is not None and self.kernel_tried == self.state.obj
                        and self.exchange_tried != self.state.obj):
                    self.exchange_step()
                else:
                    self.kernel_step()
                continue
            if step % 4 == 0:
                self.dp_step()
            elif step % 4 == 3 and self.state.U is not None and (self.state.obj, self.binding_size) \
                    != self.binding_tried:
                self.binding_step()
            elif self.lns_step(step % 4):
                break
            if self.kicks:
                self.kick()
        self.stats.update(seconds=time.perf_counter() - self.t0, sub_failures=self.state.failures,
                          budget=self.budget)
        return SearchResult(self.best_x, self.best, self.trace, self.stats)

    def few(self, count: int) -> np.ndarray:
        """Each node's ``count`` best strategies by score and by the dual's costs."""
        return best_few(self.space, self.state.x, self.theta() if self.theta else None, count)

    def descend(self) -> None:
        """Node and pair moves after a gain, until neither improves."""
        self.stats["node_moves"] += node_moves(self.state, self.deadline)
        self.stats["pair_moves"] += pair_moves(self.state, self.deadline)

    def whole_time(self) -> float:
        """Time for a sub-solve over a large part of the problem."""
        left = self.deadline - time.perf_counter()
        return min(max(10 * self.step_time, 0.25 * left), left)

    def seed(self) -> int:
        return int(self.rng.integers(1 << 20))

    def note(self) -> None:
        """Count a step; keep the state's plan if it is the best so far."""
        self.since_gain += 1
        if self.state.obj < self.best:
            self.best_x, self.best = self.state.x.copy(), self.state.obj
            self.last_gain, self.since_gain = time.perf_counter(), 0
            self.trace.append((self.last_gain - self.t0, self.best))

    def progress(self) -> None:
        now = time.perf_counter()
        if not self.log or now - self.last_log < self.every:
            return
        b = self.bound() if self.bound else -math.inf
        gap = (self.best - b) / max(abs(self.best), 1e-300) if math.isfinite(b) else math.inf
        state = self.stats
        self.log(f"search {now - self.t0:6.1f}s incumbent {self.best:.10g} bound {b:.10g} gap {gap:.3%} "
                 f"lns {state['lns_better']}/{state['lns']} dp {state['dp_better']}/{state['dp']} "
                 f"kernel {state['kernel_better']}/{state['kernel']} "
                 f"binding {state['binding_better']}/{state['binding']} "
                 f"exchange {state['exchange_better']}/{state['exchange']} "
                 f"budget {self.budget} restarts {state['restarts']}")
        self.last_log = now

    def kernel_step(self) -> None:
        """The whole problem over each node's best few strategies (size adapts)."""
        self.since_gain = 0
        self.kernel_tried = self.state.obj
        better, optimal, _ = kernel_move(self.state, self.theta() if self.theta else None,
                                         self.kernel_size, self.whole_time(), self.seed())
        self.stats["kernel"] += 1
        self.stats["kernel_better"] += better
        self.kernel_size = self.kernel_size + 1 if optimal else max(self.kernel_size - 1, 1)
        if better:
            self.descend()
        self.note()

    def exchange_step(self) -> None:
        """A blocked move paid for by a hub's chain (once per plan)."""
        self.since_gain = 0
        self.exchange_tried = self.state.obj
        deadline = time.perf_counter() + self.whole_time()
        better = exchange_move(self.state, self.rng, deadline, self.seed())
        self.stats["exchange"] += 1
        self.stats["exchange_better"] += better
        if better:
            self.descend()
        self.note()

    def dp_step(self) -> None:
        self.stats["dp"] += 1
        if dp_move(self.state, self.rng, self.prices):
            self.stats["dp_better"] += 1
            self.prices.decay()
            self.stats["pair_moves"] += pair_moves(self.state, self.deadline)
        self.note()

    def binding_step(self) -> None:
        """Every node holding memory on the full rows, over its best few strategies."""
        self.binding_tried = (self.state.obj, self.binding_size)
        nodes = binding(self.space, self.state.U, 4 * self.budget, self.rng)
        better, optimal, _ = lns_move(self.state, nodes, self.whole_time(), self.seed(),
                                      self.few(self.binding_size))
        self.stats["binding"] += 1
        self.stats["binding_better"] += better
        # nothing cheaper within that many strategies per node: widen (all of them at most)
        self.binding_size = 2 if better else min(self.binding_size + optimal, int(self.space.k.max()) + 1)
        if better:
            self.descend()
        self.note()

    def lns_step(self, kind: int) -> bool:
        """A neighbourhood re-solved exactly; True when it covered the whole problem
        (the plan is optimal) or no time is left."""
        space, state, rng = self.space, self.state, self.rng
        if kind == 3 and state.U is not None:
            rows = np.flatnonzero(state.U >= np.quantile(state.U, 0.9))
            nodes = window(space, int(rng.choice(rows)), self.budget, rng)
        elif kind == 2:
            nodes = ball(space, costly_node(state, rng), self.budget, rng)
        else:  # a ball four times larger over each node's best few strategies
            nodes = ball(space, int(rng.integers(space.n)), _BIG_BALL * self.budget, rng)
        left = self.deadline - time.perf_counter()
        if left < 0.2:
            return True
        keep = self.few(3) if kind == 1 else None
        better, optimal, secs = lns_move(state, nodes, min(4 * self.step_time, left), self.seed(), keep)
        self.stats["lns"] += 1
        self.stats["lns_better"] += better
        self.stats["lns_optimal"] += optimal
        if optimal and nodes.size == space.n and keep is None:  # the whole problem, exactly
            self.stats["exhausted"] = True
            self.note()
            return True
        # aim at ~step_time per sub-solve
        f = min(max((self.step_time / max(secs, 1e-3)) ** 0.5, 0.7), 1.3) if optimal else 0.6
        self.budget = min(max(int(self.budget * f), 50), self.max_budget)
        if better:
            self.descend()
        self.note()
        return False

    def kick(self) -> None:
        """After a long stretch without a gain, re-draw a random region of the best plan."""
        stagnant = time.perf_counter() - self.last_gain
        if (stagnant <= max(_KICK_SHARE * self.time_limit, _KICK_MIN)
                or self.deadline - time.perf_counter() <= _KICK_LEFT * self.time_limit):
            return
        self.stats["restarts"] += 1
        x = self.best_x.copy()
        region = ball(self.space, int(self.rng.integers(self.space.n)), self.budget * 3, self.rng)
        for u in region.tolist():
            x[u] = self.rng.integers(self.space.k[u])
        ok, _ = self.state.fits(x)
        self.state.set(self.best_x if not ok else x)
        self.last_gain = time.perf_counter()


def search(compact: Compact, x0: np.ndarray, time_limit: float, *, seed: int = 0,
           bound: Callable[[], float] | None = None, log: Callable[[str], None] | None = None,
           every: float = 5.0, step_time: float = 0.5, budget: int = 3000,
           space: Space | None = None, theta: Callable[[], np.ndarray | None] | None = None,
           stop_at: float = -math.inf, max_budget: int = 200_000,
           kicks: bool = True, stall: float = math.inf) -> SearchResult:
    """Improve the feasible compact plan ``x0`` until ``time_limit`` seconds have passed
    (or the objective reaches ``stop_at``, e.g. a proven bound).

    ``theta``: reparametrized costs from the dual (ranking for the kernel moves).
    ``budget``/``max_budget``: start and cap of the LNS size (variables of a sub-MIP);
    ``stats["budget"]`` is the size it adapted to (the start of a continued search).
    ``stats["exhausted"]``: an exact sub-solve covered every node, the plan is optimal.
    ``kicks=False``: no restarts from a re-drawn region (for polishing a plan near the
    bound: on IOPDDL M a kick costs the rest of a 20 s chunk to climb back, if it does).
    ``stall``: return once that many seconds pass without a better plan (kicks do not
    count), so a caller can end a stuck run early (IOPDDL V: runs reach their plan in
    2-15 s, then find nothing).
    """
    return LocalSearch(compact, x0, time_limit, seed=seed, bound=bound, log=log, every=every,
                       step_time=step_time, budget=budget, space=space, theta=theta, stop_at=stop_at,
                       max_budget=max_budget, kicks=kicks, stall=stall).run()
