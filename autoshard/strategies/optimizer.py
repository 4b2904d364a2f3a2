"""Optimizer foreach ops, one node per list element: elementwise followers of their first tensor.

Following the first operand (the parameter or optimizer-state slot being updated)
keeps the update in the parameter's sharding; the gradient is resharded to match
(all-reduce for replicated, reduce-scatter for sharded parameters).
"""
from __future__ import annotations

from autoshard.graph import Graph, Node
from autoshard.strategies.base import DimRule
from autoshard.strategies.elementwise import elementwise_rule
from autoshard.strategies.registry import register

FOREACH = ("aten._foreach_add", "aten._foreach_add_", "aten._foreach_sub", "aten._foreach_sub_",
           "aten._foreach_mul", "aten._foreach_mul_", "aten._foreach_div", "aten._foreach_div_",
           "aten._foreach_lerp", "aten._foreach_lerp_", "aten._foreach_addcmul", "aten._foreach_addcmul_",
           "aten._foreach_addcdiv", "aten._foreach_addcdiv_", "aten._foreach_sqrt", "aten._foreach_sqrt_",
           "aten._foreach_neg", "aten._foreach_neg_", "aten._foreach_copy_", "aten._foreach_maximum_",
           "aten._foreach_reciprocal_", "aten._foreach_pow")
# fused steps (``Adam(fused=True)``): one graph node per updated tensor (xla_dtensor.auto.ir_graph), the foreach rule
FUSED_STEPS = ("aten._fused_adam_", "aten._fused_adamw_", "aten._fused_sgd_", "aten._fused_adagrad_")
FOREACH += FUSED_STEPS


# single-tensor optimizer paths (torch picks them for tensor subclasses): the same rule per tensor
SINGLE = ("aten.lerp_", "aten.addcmul_", "aten.addcdiv_", "aten.sqrt_", "aten.maximum_")


@register(*FOREACH, *SINGLE)
def foreach(node: Node, graph: Graph) -> DimRule:
    from dataclasses import replace

    return replace(elementwise_rule(node, graph), leader=0)
