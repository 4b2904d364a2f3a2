"""The memory exchange move (autoshard.solver._exchange) against brute force.

The instance is built so that only the exchange helps: node ``u``'s cheaper strategy
needs the memory that hub ``h`` holds, ``h`` is not adjacent to ``u``, and ``h`` can
give it up cheaply only if the whole chain behind it switches too; a triangle hangs off
the chain's end, which a forest must cut (the DP leaves it behind at a small cost, the
exact ball around the cut node moves it). Node and pair moves from the start plan stay.
"""
from __future__ import annotations

import numpy as np
import pytest

from autoshard.solver._compact import plan_of, x_of
from autoshard.solver._dominance import compact_presolve
from autoshard.solver._exchange import blocked_moves, exchange_move
from autoshard.solver._memory import memory_rows
from autoshard.solver._moves import State, node_moves, pair_moves
from autoshard.solver._presolve import flatten, reduce
from autoshard.solver._space import Space
from autoshard.solver.brute import brute_force
from autoshard.solver.evaluate import evaluate
from autoshard.solver.problem import Problem

def _agree(switch: float) -> np.ndarray:
    """Edge costs: nothing when both ends pick the same strategy, ``switch`` otherwise."""
    return np.array([[0.0, switch], [switch, 0.0]])


def _exchange_problem(chain: int) -> Problem:
    """u (0), hub h (1), a chain 2..chain+1 behind h, a triangle after its last node."""
    n = chain + 5
    costs = [np.array([10.0, 0.0]), np.array([0.0, 1.0])] + [np.zeros(2) for _ in range(n - 2)]
    memory = [np.array([0.0, 5.0]), np.array([5.0, 0.0])] + [np.zeros(2) for _ in range(n - 2)]
    intervals = [(0, 2), (0, 2)] + [(2, 3)] * (n - 2)
    last, a, b, c = chain + 1, chain + 2, chain + 3, chain + 4
    edges = [(i, i + 1) for i in range(1, last)] + [(last, a), (a, b), (b, c), (a, c)]
    edge_costs = [_agree(50.0)] * (last - 1) + [_agree(3.0)] + [_agree(50.0)] * 3
    return Problem("exchange", costs, memory, intervals, edges, edge_costs, 5.0)


@pytest.mark.parametrize("chain", [2, 4])  # the triangle within the forest's 6 hops
def test_exchange_finds_the_trade_single_moves_miss(chain: int) -> None:
    p = _exchange_problem(chain)
    best, plan, _ = brute_force(p)
    f = flatten(p)
    red = reduce(f, dedup=False)
    cp = compact_presolve(red, memory_rows(f, red.allowed, p.memory_limit), p.memory_limit)[0]
    sp = Space(cp)
    start = x_of(cp, np.zeros(p.num_nodes, np.int64))  # everyone at strategy 0: cost 10
    state = State(sp, start)
    node_moves(state, 1e18)
    pair_moves(state, 1e18)
    assert state.obj == pytest.approx(10.0)  # stuck: u's move does not fit, h's costs 50
    assert [m[2] for m in blocked_moves(sp, state, 3)] == [pytest.approx(10.0)]
    assert exchange_move(state, np.random.default_rng(0), 1e18, 0)
    cost, ok, _ = evaluate(p, plan_of(cp, state.x).tolist())
    assert ok and cost == pytest.approx(state.obj) == pytest.approx(best) == pytest.approx(1.0)
