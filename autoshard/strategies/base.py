"""Strategy rules as labelled dims (einsum style) and their enumeration over a mesh.

Every op family describes an op by a :class:`DimRule`: a label per dim of every tensor
input and output. Sharding a label along a mesh axis splits every dim carrying it;
a label found only in inputs is contracted and leaves ``Partial`` outputs (allowed only
for sum-like labels in ``partial``); a label found only in outputs leaves the inputs
replicated; ``None`` labels (normalized, gathered, concatenated dims) are never split.
Leaders enumerate all label choices per mesh axis; followers (elementwise and shape
ops) get exactly one strategy per strategy of the input they follow, which lets the
solver tie them to it.

Example:
    >>> rule = DimRule(inputs=(("m", "k"), ("k", "n")), outputs=(("m", "n"),), partial=frozenset({"k"}))
    >>> from autoshard.graph import TensorMeta
    >>> t = TensorMeta((8, 8))
    >>> [s.name for s in enumerate_strategies(rule, (t, t), (t,), (2,))]
    ['R', 'm', 'k', 'n']
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from autoshard.graph import TensorMeta
from autoshard.spec import Spec, is_shard

Label = Optional[str]
PARTIAL = "<partial>"  # a follower axis on which a Partial value flows through a linear op


@dataclass(frozen=True, slots=True)
class DimRule:
    """Labels per dim of each tensor input and output (see module docstring).

    ``additive``: input positions that take ``P`` when a partial label is split (the bias
    of ``addmm``). ``linear``: a ``Partial`` leader flows through (views, scaling, sums);
    with several inputs the op is linear in all of them jointly (``a + b``), so every
    input takes ``P`` where the leader is ``P``. ``passthrough``: input positions a leader
    is linear in (the gradient of an embedding backward): one more option per mesh axis
    keeps a ``Partial`` value ``Partial`` (those inputs ``P``, the others replicated, the
    outputs ``P``), so the reduction can wait for a later, cheaper place.
    ``follower``: one strategy per strategy of input ``leader``. ``flops``: global flops.
    ``shape_only``: the op reads only its leader's shape (``ones_like``): a ``Partial``
    leader is taken as it is (no reduction) and the output is replicated on that axis.
    ``unread``: input positions whose values the op never reads (``new_zeros``'s template):
    any layout serves, so they cost no resharding. ``internal``: labels the op reduces
    inside itself with an all-reduce of ``internal_bytes`` (batch norm's statistics over a
    split batch): outputs without the label are whole (not ``Partial``).
    ``whole_compute``: the op runs whole on every device even when its outputs are handed
    on sliced (an opaque op: a slice of a replicated result is free, the work is not split).
    ``independent``: ``(output, label)`` pairs where that output does not depend on the
    label's dim at all (a convolution's bias gradient and the input channels): splitting
    the label leaves that output whole on every device, not ``Partial``.
    """

    inputs: tuple[tuple[Label, ...], ...]
    outputs: tuple[tuple[Label, ...], ...]
    partial: frozenset[str] = frozenset()
    additive: frozenset[int] = frozenset()
    linear: bool = False
    follower: bool = False
    leader: int = 0
    flops: float = 0.0
    passthrough: frozenset[int] = frozenset()
    shape_only: bool = False
    unread: frozenset[int] = frozenset()
    internal: frozenset[str] = frozenset()
    internal_bytes: float = 0.0
    whole_compute: bool = False
    independent: frozenset[tuple[int, str]] = frozenset()


@dataclass(frozen=True, slots=True)
class Strategy:
    """One way to run an op: required input specs, produced output specs, work split."""

    name: str
    in_specs: tuple[Spec, ...]
    out_specs: tuple[Spec, ...]
    split: int = 1  # the work is divided this many ways
    reduce_axes: tuple[int, ...] = ()  # mesh axes of the op's own all-reduce (DimRule.internal)


Assignment = tuple[Label, ...]  # per mesh axis: the label split along it, None, or PARTIAL


class RuleShapeError(ValueError):
    """A rule's labels do not fit the node it was made for (wrong count or rank of tensors)."""


def check_rule(rule: DimRule, in_metas: Sequence[TensorMeta], out_metas: Sequence[TensorMeta]) -> None:
    """Raise :class:`RuleShapeError` unless ``rule`` labels every dim of every input and output once."""
    for kind, labels, metas in (("input", rule.inputs, in_metas), ("output", rule.outputs, out_metas)):
        if len(labels) != len(metas):
            raise RuleShapeError(f"rule labels {len(labels)} {kind}s, the node has {len(metas)}")
        for i, (lab, meta) in enumerate(zip(labels, metas)):
            if len(lab) != meta.ndim:
                raise RuleShapeError(f"{kind} {i}: labels {lab} for a tensor of shape {meta.shape}")
    if rule.follower and in_metas and not 0 <= rule.leader < len(in_metas):
        raise RuleShapeError(f"leader input {rule.leader} out of range 0..{len(in_metas) - 1}")


def _labels(rule: DimRule) -> tuple[set[str], set[str]]:
    ins = {l for t in rule.inputs for l in t if l is not None}
    outs = {l for t in rule.outputs for l in t if l is not None}
    return ins, outs


def _valid(rule: DimRule, assign: Assignment, metas: Sequence[TensorMeta], axis_sizes: Sequence[int]) -> bool:
    ins, outs = _labels(rule)
    dims = list(rule.inputs) + list(rule.outputs)
    allowed = rule.partial | rule.internal
    for label in set(assign) - {None, PARTIAL}:
        if label in ins and label not in outs and label not in allowed:
            return False
        if label in ins and label not in allowed and any(
                label not in o and (j, label) not in rule.independent for j, o in enumerate(rule.outputs)):
            return False
        n = math.prod(s for l, s in zip(assign, axis_sizes) if l == label)
        for labels, meta in zip(dims, metas):
            if any(l == label and meta.shape[d] % n for d, l in enumerate(labels)):
                return False
    return True


def specs_for(rule: DimRule, assign: Assignment) -> tuple[tuple[Spec, ...], tuple[Spec, ...]]:
    """Input and output specs implied by splitting label ``assign[a]`` along mesh axis ``a``."""
    ins_all, _ = _labels(rule)

    def place(labels: tuple[Label, ...], label: Label, is_input: bool, pos: int) -> object:
        if label is None:
            return "R"
        if label == PARTIAL:
            return "P" if not is_input or not rule.passthrough or pos in rule.passthrough else "R"
        if label in labels:
            return ("S", labels.index(label))
        if is_input:
            return "P" if label in rule.partial and pos in rule.additive else "R"
        return "P" if label in ins_all and label not in rule.internal and (pos, label) not in rule.independent else "R"

    in_specs = tuple(tuple(place(t, l, True, i) for l in assign) for i, t in enumerate(rule.inputs))
    out_specs = tuple(tuple(place(t, l, False, j) for l in assign) for j, t in enumerate(rule.outputs))
    return in_specs, out_specs


def _name(assign: Assignment) -> str:
    return ",".join("R" if l is None else "P" if l == PARTIAL else l for l in assign) or "R"


def _strategy(rule: DimRule, assign: Assignment, axis_sizes: Sequence[int]) -> Strategy:
    ins, outs = specs_for(rule, assign)
    split = 1 if rule.whole_compute else math.prod(n for l, n in zip(assign, axis_sizes) if l is not None and l != PARTIAL)
    reduce = tuple(a for a, l in enumerate(assign) if l in rule.internal and axis_sizes[a] > 1)
    return Strategy(_name(assign), ins, outs, split, reduce)


def enumerate_strategies(rule: DimRule, in_metas: Sequence[TensorMeta], out_metas: Sequence[TensorMeta],
                         axis_sizes: Sequence[int]) -> list[Strategy]:
    """All label choices per mesh axis that divide evenly (a leader's strategy list)."""
    ins, outs = _labels(rule)
    options: list[Label] = [None] + sorted(outs | (ins & (rule.partial | rule.internal)), key=_order(rule))
    if rule.passthrough:
        options.append(PARTIAL)
    metas = list(in_metas) + list(out_metas)
    result = []
    for assign in itertools.product(options, repeat=len(axis_sizes)):
        if all(n == 1 for l, n in zip(assign, axis_sizes) if l is not None) and any(assign):
            continue  # size-1 axes: splitting is the same as replicating
        if _valid(rule, assign, metas, axis_sizes):
            result.append(_strategy(rule, assign, axis_sizes))
    return result


def _order(rule: DimRule) -> Callable[[str], tuple[int, int]]:
    seen = [l for t in rule.inputs + rule.outputs for l in t if l is not None]
    return lambda l: (0, seen.index(l))


def follow_strategies(rule: DimRule, leader_specs: Sequence[Spec], in_metas: Sequence[TensorMeta],
                      out_metas: Sequence[TensorMeta], axis_sizes: Sequence[int]) -> list[Strategy]:
    """One strategy per leader spec: keep each split the rule can carry, replicate the rest."""
    metas = list(in_metas) + list(out_metas)
    labels = rule.inputs[rule.leader]
    result = []
    for spec in leader_specs:
        assign: list[Label] = []
        for p in spec:
            if is_shard(p):
                assign.append(labels[p[1]] if p[1] < len(labels) else None)
            elif p == "P" and rule.linear:
                assign.append(PARTIAL)
            else:
                assign.append(None)
        kept: list[Label] = [None] * len(assign)
        for a, label in enumerate(assign):  # keep the splits this op can carry, axis by axis
            trial = kept[:a] + [label] + kept[a + 1:]
            if label is None or _valid(rule, tuple(trial), metas, axis_sizes):
                kept = trial
        strat = _strategy(rule, tuple(kept), axis_sizes)
        if rule.shape_only and "P" in spec:
            ins = list(strat.in_specs)
            ins[rule.leader] = tuple("P" if p == "P" else q for p, q in zip(spec, ins[rule.leader]))
            strat = Strategy(strat.name, tuple(ins), strat.out_specs, strat.split)
        result.append(strat)
    return result
