"""Plans and bounds exchanged between an anytime search and its peers.

In the calling process the peers are the worker searches of a
:class:`~autoshard.solver._portfolio.Portfolio`; in a worker, the caller (its plans
arrive through ``inbox``). :meth:`PeerExchange.exchange` takes a better peer plan (the
run continues from it when it came from the caller, or when polishing near the bound),
merges two polishes of one plan near the bound, and sends this process's better plan
to the workers.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Callable

import numpy as np

from autoshard.solver._compact import Compact
from autoshard.solver._moves import merge

if TYPE_CHECKING:
    from autoshard.solver._anytime import AnytimeSearch

__all__ = ["PeerExchange"]

_MERGE_SEED_STRIDE = 17  # a new seed per merge with a worker's plan


class PeerExchange:
    """The channel between ``search`` and its peers: ``workers - 1`` subprocess searches
    (only for limits over 5 s: their start-up would eat a shorter one) and ``inbox``."""

    def __init__(self, search: AnytimeSearch, compact: Compact, start: np.ndarray, workers: int,
                 inbox: Callable[[], tuple[float, np.ndarray, float] | None] | None) -> None:
        self.search, self.inbox = search, inbox
        self.bound = -math.inf      # the highest bound a peer reported
        self.shared = math.inf      # the last objective sent to the workers
        self.merged = math.nan      # the worker objective last merged with
        self.portfolio = None
        if workers > 1 and search.time_limit > 5.0:
            from autoshard.solver._portfolio import Portfolio
            stride = search.settings.worker_seed_stride
            self.portfolio = Portfolio(compact, start, search.time_limit - 0.5,
                                       [search.seed + stride * i for i in range(1, workers)],
                                       nice=search.settings.worker_nice)

    def exchange(self) -> None:
        """Take the caller's plan (in a worker) or the workers' (in the caller) if better;
        send this process's best to the workers when theirs is worse."""
        self._from_caller()
        if self.portfolio is None:
            return
        search = self.search
        obj, x, bound = self.portfolio.best()
        self.bound = max(self.bound, bound)
        polishing = search.near(search.best)
        if x is not None and polishing:
            x, obj = self._merge_polishes(x, obj)
        if x is not None and obj < search.best:
            search.improve(x, obj, run_goes_on=polishing)
            search.stats["peer_best"] += 1
        elif search.best < min(obj, self.shared):
            self.portfolio.share(search.best, search.best_x, search.bound_now())
            self.shared = search.best

    def _from_caller(self) -> None:
        got = self.inbox() if self.inbox is not None else None
        if got is None:
            return
        self.bound = max(self.bound, got[2])
        if got[0] < self.search.best:  # the run goes on from it
            self.search.improve(got[1], got[0], run_goes_on=True)
            self.search.stats["peer_best"] += 1

    def _merge_polishes(self, x: np.ndarray, obj: float) -> tuple[np.ndarray, float]:
        """Two polishes of one plan near the bound: the union of their strategies often
        holds the gains of both (once per worker plan)."""
        search = self.search
        if (obj == self.merged or search.left() <= 1.5 or np.array_equal(x, search.best_x)):
            return x, obj
        self.merged = obj
        stats = search.stats
        merged, merged_obj = merge(search.space, [search.best_x, x],
                                   min(search.merge_time(), search.left() - 0.5),
                                   search.seed + _MERGE_SEED_STRIDE * stats["peer_merges"])
        stats["peer_merges"] += 1
        if merged_obj < min(search.best, obj):
            stats["peer_merge_better"] += 1
            search.say(f"merge with a worker's plan: {merged_obj:.10g}")
            return merged, merged_obj
        return x, obj

    def close(self, wait: float) -> None:
        """Let the workers finish for up to ``wait`` seconds, then take their last plans."""
        if self.portfolio is None:
            return
        self.portfolio.close(wait=wait)
        self.exchange()
        stats = self.search.stats
        stats["peer_errors"], stats["peer_killed"] = self.portfolio.errors, self.portfolio.killed
