"""Mixture-of-experts routing and dispatch: one-hot masks, expert counts, grouped expert matmuls.

* ``one_hot(ids, C) -> [..., C]``: the ids' dims follow, the class dim stays whole.
* ``histc`` / ``bincount``: counts are sums over the input's elements, so a split input
  leaves ``Partial`` counts (reduced where a consumer needs them whole).
* ``_grouped_mm``, the batched expert matmul (rows of ``a`` grouped by expert through the
  offsets ``offs``): ``[S, K] x [E, K, N] -> [S, N]`` splits the tokens ``S``, the output
  features ``N``, the contraction ``K`` (``Partial``) or the **experts** ``E`` (expert
  parallelism: each device holds ``E/n`` experts and computes only its experts' rows;
  every row belongs to one expert, so the sum over devices is the output, ``Partial``).
  ``[K, S] x [S, N] -> [E, K, N]`` (the weight gradient) splits ``E`` with whole inputs,
  ``K``, ``N``, or the tokens ``S`` (``Partial``); ``[E, M, K] x [E, K, N]`` is a batched
  matmul over ``E``. The offsets are tiny and stay whole.
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies._util import dims, ins
from autoshard.strategies.base import DimRule
from autoshard.strategies.registry import register


@register("aten.one_hot")
def one_hot(node: Node, graph: Graph) -> DimRule:
    (ids,) = ins(node, graph)[:1]
    labels = dims("d", ids.ndim)
    return DimRule((labels,), (labels + (None,),), follower=True, flops=float(node.outputs[0].numel))


@register("aten.histc", "aten.bincount")
def counts(node: Node, graph: Graph) -> DimRule:
    """(x, [weights,] bins...) -> counts: every element lands in one bin, so split inputs sum."""
    metas = ins(node, graph)
    labels = dims("d", metas[0].ndim)
    in_labels = (labels,) + tuple(labels if m.shape == metas[0].shape else (None,) * m.ndim for m in metas[1:])
    return DimRule(in_labels, tuple((None,) * o.ndim for o in node.outputs), frozenset(labels), follower=True,
                   flops=2.0 * metas[0].numel)


@register("aten._grouped_mm")
def grouped_mm(node: Node, graph: Graph) -> DimRule:
    """(a, b, offs?, bias?, out_dtype?) -> out; see the module docstring for the three forms."""
    metas = ins(node, graph)
    a, b, out = metas[0], metas[1], node.outputs[0]
    rest = tuple((None,) * m.ndim for m in metas[2:])  # offsets (and a bias): whole
    if a.ndim == 2 and b.ndim == 3:      # tokens grouped by expert x expert weights
        la, lb, lo, k = ("s", "k"), ("e", "k", "n"), ("s", "n"), a.shape[1]
        partial = frozenset({"k", "e"})
    elif a.ndim == 2 and b.ndim == 2:    # weight gradient: one [K, N] block per expert
        la, lb, lo, k = ("k", "s"), ("s", "n"), ("e", "k", "n"), a.shape[1]
        partial = frozenset({"s"})
    elif a.ndim == 3 and b.ndim == 3:    # batched over experts
        la, lb, lo, k = ("e", "m", "k"), ("e", "k", "n"), ("e", "m", "n"), a.shape[2]
        partial = frozenset({"k"})
    else:                                # [E, M, K] x [K, S]-style forms: expert dim of a, the rest whole
        la, lb, lo, k = ("e",) + (None,) * (a.ndim - 1), (None,) * b.ndim, ("e",) + (None,) * (out.ndim - 1), 1
        partial = frozenset()
    flops = 2.0 * out.numel * k if out.ndim == 2 else 2.0 * a.numel * b.shape[-1]
    return DimRule((la, lb) + rest, (lo,), partial, flops=flops)
