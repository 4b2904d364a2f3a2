"""Memory exchange: a node's cheaper strategy that needs memory, paid for elsewhere.

A plan at the memory limit can be stuck where one node ``u`` has a cheaper strategy
``q`` that overflows some rows, and the memory it needs could be freed only by a *hub*
``h`` holding memory on those rows, far from ``u`` in the graph, whose own change is
dear unless a whole chain of its neighbours follows. No neighbourhood of the search
holds both, and single-node scores rank the chain's strategies low. The move:

1. take ``u``'s move (the plan now overflows rows ``O`` by ``need``);
2. around each hub that can free memory on ``O``, the exact min-sum DP on a BFS forest
   (:mod:`autoshard.solver._treedp`), memory on ``O`` priced at a few multiples of
   ``gain / need``, then node and pair moves;
3. the nodes the forest had to leave out (one per cycle) get an exact LNS ball each,
   since a cycle's nodes must switch together.

IOPDDL V from 1,713,177: node 31's cheaper strategy saves 393,222 but needs 185,232
more on two rows; hub 16 frees 688,128 there at 72.9M more alone; the DP on its depth-6
forest moves 12 nodes (1,666,202) and the ball around the 4-cycle it cut moves 8 more
(1,617,084, below the published 1,632,051), in about 2 s.
"""
from __future__ import annotations

import time

import numpy as np

from autoshard.solver._moves import State, lns_move, node_moves, pair_moves
from autoshard.solver._neighbourhood import ball
from autoshard.solver._space import Space
from autoshard.solver._treedp import Forest, forest_dp

__all__ = ["blocked_moves", "memory_on", "ball_forest", "exchange_move"]

_CANDIDATES = 3              # blocked moves tried, largest gain first
_HUBS = 3                    # hubs per blocked move, most memory freed first
_PRICE_FACTORS = (0.5, 1.0, 2.0, 4.0)  # x gain/need: V's trade shows at 0.5-4
_DEPTH = 6                   # V's chain reaches 6 hops from its hub
_CYCLE_BALL = 50_000         # LNS variables around a cut cycle (V: 0.5 s, covers its 4-cycle)
_CYCLE_BALLS = 3             # cut nodes nearest the hub re-solved per exchange


def blocked_moves(space: Space, state: State, count: int) -> list[tuple[int, int, float]]:
    """(node, strategy, gain) of the ``count`` largest single-node gains that do not
    fit memory."""
    scores = space.scores(state.x)
    off = space.off
    current = scores[off[:-1] + state.x]
    best = np.minimum.reduceat(scores, off[:-1])
    with np.errstate(invalid="ignore"):
        gain = np.nan_to_num(current - best, nan=0.0)
    out = []
    for u in np.argsort(-gain, kind="stable").tolist():
        if gain[u] <= 1e-12 * max(abs(current[u]), 1.0) or len(out) == count:
            break
        q = int(np.argmin(scores[off[u]:off[u + 1]]))
        if not space.move_fits(state.U, u, int(state.x[u]), q):
            out.append((u, q, float(gain[u])))
    return out


def memory_on(space: Space, rows: np.ndarray) -> np.ndarray:
    """Memory each global strategy holds on the rows of mask ``rows`` (its terms that
    cover at least one of them)."""
    count = np.concatenate([[0], np.cumsum(rows)])
    covers = count[space.t_hi] - count[space.t_lo] > 0
    return np.bincount(space.t_g, weights=space.t_coef * covers, minlength=int(space.off[-1]))


def _bfs(space: Space, root: int, depth: int, exclude: np.ndarray,
         rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(distance, parent) of a randomized BFS from ``root`` to ``depth`` hops (-1: not
    reached), never entering ``exclude``."""
    dist = np.full(space.n, -1, np.int64)
    parent = np.full(space.n, -1, np.int64)
    dist[root], frontier = 0, [root]
    for d in range(1, depth + 1):
        nxt = []
        for v in frontier:
            for w in rng.permutation(space.nbr[space.nptr[v]:space.nptr[v + 1]]).tolist():
                if dist[w] < 0 and not exclude[w]:
                    dist[w], parent[w] = d, v
                    nxt.append(w)
        frontier = nxt
    return dist, parent


def ball_forest(space: Space, root: int, depth: int, exclude: np.ndarray,
                rng: np.random.Generator) -> tuple[Forest, np.ndarray]:
    """The BFS tree of ``root`` to ``depth`` hops as an induced forest: of every other
    edge inside it, the endpoint farther from the root is left out. Returns the forest
    and the nodes left out, nearest the root first."""
    dist, parent = _bfs(space, root, depth, exclude, rng)
    in_t = dist >= 0
    eu, ev = space.eu, space.ev
    tree = (parent[eu] == ev) | (parent[ev] == eu)
    priority = dist + rng.random(space.n)
    dropped = []
    for e in np.flatnonzero(in_t[eu] & in_t[ev] & ~tree).tolist():
        a, b = int(eu[e]), int(ev[e])
        if in_t[a] and in_t[b]:
            out = a if priority[a] > priority[b] else b
            in_t[out] = False
            dropped.append(out)
    te = np.flatnonzero(tree & in_t[eu] & in_t[ev])
    child = np.where(parent[eu[te]] == ev[te], eu[te], ev[te])
    par = np.where(child == eu[te], ev[te], eu[te])
    has_parent = np.zeros(space.n, bool)
    has_parent[child] = True
    levels = [(child[dist[child] == lv], par[dist[child] == lv], te[dist[child] == lv])
              for lv in np.unique(dist[child])[::-1].tolist()]
    dropped = np.asarray(dropped, np.int64)
    dropped = dropped[np.argsort(dist[dropped], kind="stable")]  # nearest the root first
    return Forest(in_t, levels, np.flatnonzero(in_t & ~has_parent)), dropped


def _hubs(space: Space, x: np.ndarray, memory: np.ndarray, skip: int) -> np.ndarray:
    """Nodes that can free memory (on the rows ``memory`` covers), most first."""
    held = memory[space.off[:-1] + x]
    least = np.minimum.reduceat(memory, space.off[:-1])
    free = held - least
    free[skip] = 0.0
    order = np.argsort(-free, kind="stable")[:_HUBS]
    return order[free[order] > 0]


def _trade(space: Space, state: State, move: tuple[int, int, float], rng: np.random.Generator,
           deadline: float) -> tuple[State | None, np.ndarray]:
    """The best plan the DP finds with ``move`` made and its memory paid by a hub, and
    the nodes its forest left out."""
    u, q, gain = move
    x = state.x.copy()
    x[u] = q
    usage = space.usage(x)
    over = usage > space.limit
    need = float((usage - space.limit)[over].max())
    memory = memory_on(space, over)
    exclude = np.zeros(space.n, bool)
    exclude[u] = True
    best, best_dropped = None, np.zeros(0, np.int64)
    for hub in _hubs(space, x, memory, u).tolist():
        for factor in _PRICE_FACTORS:
            if time.perf_counter() > deadline:
                return best, best_dropped
            forest, dropped = ball_forest(space, hub, _DEPTH, exclude, rng)
            plan = forest_dp(space, space.off[:-1] + x, forest, factor * gain / need * memory)
            trial = State(space, plan - space.off[:-1])
            if not (trial.U <= space.limit).all() or not np.isfinite(trial.obj):
                continue
            node_moves(trial, deadline)
            pair_moves(trial, deadline)
            if best is None or trial.obj < best.obj:
                best, best_dropped = trial, dropped
    return best, best_dropped


def exchange_move(state: State, rng: np.random.Generator, deadline: float, seed: int) -> bool:
    """Try the largest blocked moves with their memory paid by a hub and its chain;
    True if the plan improved."""
    space = state.space
    if space.limit is None or state.U is None:
        return False
    for move in blocked_moves(space, state, _CANDIDATES):
        trial, dropped = _trade(space, state, move, rng, deadline)
        if trial is None:
            continue
        for v in dropped[:_CYCLE_BALLS].tolist():
            left = deadline - time.perf_counter()
            if left <= 0.2:
                break
            lns_move(trial, ball(space, v, _CYCLE_BALL, rng), left, seed)
        if state.offer(trial.x):
            return True
    return False
