"""Megatron tensor-parallel plans for HF transformers models, for torch's ``parallelize_module``.

:func:`megatron_plan` returns the ``{module path: style}`` plan of torch's own styles
for a model family it knows (the attention's q/k/v and the MLP's input projections
column-split, the attention output and MLP output row-split), with or without
sequence parallelism (torch's TP tutorial: norms on sequence shards, row-split outputs
reduce-scattered to sequence shards, ``PrepareModuleInput`` gathering them before the
attention and the MLP). GPT-2's projections are HF ``Conv1D`` (a linear whose weight is
stored transposed), which torch's styles reject; :class:`Conv1DColwiseParallel` and
:class:`Conv1DRowwiseParallel` split them the same way.

Example:
    >>> sorted(megatron_plan("llama"))[:2]
    ['model.layers.*.mlp.down_proj', 'model.layers.*.mlp.gate_proj']
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from torch import nn
from torch.distributed.tensor import Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

__all__ = ["Conv1DColwiseParallel", "Conv1DRowwiseParallel", "FAMILIES", "megatron_plan"]


def _is_conv1d(module: nn.Module) -> bool:
    """HF ``Conv1D``: ``y = x @ weight + bias`` with ``weight`` of shape ``(in, out)``."""
    w = getattr(module, "weight", None)
    return type(module).__name__ == "Conv1D" and w is not None and w.dim() == 2 \
        and tuple(w.shape) == (getattr(module, "nx", -1), getattr(module, "nf", -1))


def _shard_params(module: nn.Module, mesh: Any, placements: dict[str, Any], src_data_rank: int | None) -> None:
    for name, param in list(module.named_parameters(recurse=False)):
        dist = distribute_tensor(param, mesh, [placements[name]], src_data_rank=src_data_rank)
        module.register_parameter(name, nn.Parameter(dist, requires_grad=param.requires_grad))


class Conv1DColwiseParallel(ColwiseParallel):
    """``ColwiseParallel`` that also takes HF ``Conv1D`` (weight ``Shard(1)``, bias ``Shard(0)``)."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not _is_conv1d(module):
            return super()._apply(module, device_mesh)
        part = {"weight": Shard(1), "bias": Shard(0)}
        return distribute_module(
            module, device_mesh,
            lambda name, mod, mesh: _shard_params(mod, mesh, part, self.src_data_rank) if mod is module else None,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


class Conv1DRowwiseParallel(RowwiseParallel):
    """``RowwiseParallel`` that also takes HF ``Conv1D`` (weight ``Shard(0)``, bias ``Replicate()``)."""

    def _apply(self, module: nn.Module, device_mesh: Any) -> nn.Module:
        if not _is_conv1d(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts = (Shard(-1),)
        part = {"weight": Shard(0), "bias": Replicate()}
        return distribute_module(
            module, device_mesh,
            lambda name, mod, mesh: _shard_params(mod, mesh, part, self.src_data_rank) if mod is module else None,
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output))


@dataclass(frozen=True)
class Family:
    """Where a family's Megatron pieces are, relative to each block under ``layers``.

    ``prepare``: (module, how its hidden states come in: a keyword, or ``None`` for the
    first positional argument) for the modules whose input is gathered under sequence
    parallelism; ``norms`` run on sequence shards. A family without ``norms`` has no
    sequence-parallel plan (post-norm blocks whose norm follows a residual inside a module).
    """

    layers: tuple[str, ...]
    col: tuple[str, ...]
    row: tuple[str, ...]
    norms: tuple[str, ...] = ()
    prepare: tuple[tuple[str, str | None], ...] = ()
    conv1d: bool = False


_LLAMA = Family(("model.layers",), ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                    "mlp.gate_proj", "mlp.up_proj"), ("self_attn.o_proj", "mlp.down_proj"),
                ("input_layernorm", "post_attention_layernorm"), (("self_attn", "hidden_states"), ("mlp", None)))
_T5_ENC = ("layer.0.SelfAttention.q", "layer.0.SelfAttention.k", "layer.0.SelfAttention.v")
FAMILIES: dict[str, Family | tuple[Family, ...]] = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA,
    "mixtral": Family(("model.layers",), _LLAMA.col[:3], _LLAMA.row[:1], _LLAMA.norms, _LLAMA.prepare[:1]),
    "gpt2": Family(("transformer.h",), ("attn.c_attn", "mlp.c_fc"), ("attn.c_proj", "mlp.c_proj"),
                   ("ln_1", "ln_2"), (("attn", None), ("mlp", None)), conv1d=True),
    "gpt_neo": Family(("transformer.h",), ("attn.attention.q_proj", "attn.attention.k_proj",
                                           "attn.attention.v_proj", "mlp.c_fc"),
                      ("attn.attention.out_proj", "mlp.c_proj"), ("ln_1", "ln_2"), (("attn", None), ("mlp", None))),
    "bert": Family(("bert.encoder.layer",), ("attention.self.query", "attention.self.key", "attention.self.value",
                                             "intermediate.dense"), ("attention.output.dense", "output.dense")),
    "t5": (Family(("encoder.block", "decoder.block"), _T5_ENC + ("layer.-1.DenseReluDense.wi",),
                  ("layer.0.SelfAttention.o", "layer.-1.DenseReluDense.wo")),
           Family(("decoder.block",), tuple(n.replace("0.SelfAttention", "1.EncDecAttention") for n in _T5_ENC),
                  ("layer.1.EncDecAttention.o",))),
}


def megatron_plan(model: nn.Module | str, sequence_parallel: bool = False) -> dict[str, ParallelStyle]:
    """The Megatron plan of ``model`` (a HF model, or its ``config.model_type``) for
    ``parallelize_module(model, device_mesh["tp"], plan)``.

    Mixtral: attention only (its experts are 3-D parameters no torch style splits).
    T5's last sub-layer index differs between encoder (1) and decoder (2): ``layer.-1``
    is resolved against ``model`` when a model is given (a type name keeps ``-1``).

    Raises:
        KeyError: an unknown family (the message lists the known ones).
        ValueError: ``sequence_parallel`` for a family without a sequence-parallel plan.
    """
    kind = model if isinstance(model, str) else getattr(getattr(model, "config", None), "model_type", None)
    found = FAMILIES.get(kind)  # type: ignore[arg-type]
    if found is None:
        raise KeyError(f"no Megatron plan for model type {kind!r}; known: {sorted(FAMILIES)}")
    plan: dict[str, ParallelStyle] = {}
    for fam in found if isinstance(found, tuple) else (found,):
        if sequence_parallel and not fam.norms:
            raise ValueError(f"{kind}: no sequence-parallel plan (post-norm blocks); use sequence_parallel=False")
        _add(plan, model, fam, sequence_parallel)
    return plan


def _add(plan: dict[str, ParallelStyle], model: nn.Module | str, fam: Family, sequence_parallel: bool) -> None:
    col, row = (Conv1DColwiseParallel, Conv1DRowwiseParallel) if fam.conv1d else (ColwiseParallel, RowwiseParallel)
    for layers in fam.layers:
        put = lambda name, style: plan.__setitem__(_resolve(model, layers, name), style)  # noqa: E731
        for name in fam.col:
            put(name, col())
        for name in fam.row:
            put(name, row(output_layouts=Shard(1)) if sequence_parallel else row())
        if sequence_parallel:
            for name in fam.norms:
                put(name, SequenceParallel())
            for name, kw in fam.prepare:
                put(name, PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
                    if kw is None else PrepareModuleInput(input_kwarg_layouts={kw: Shard(1)},
                                                          desired_input_kwarg_layouts={kw: Replicate()}))


def _resolve(model: nn.Module | str, layers: str, name: str) -> str:
    """``layers.*.name`` with a ``layer.-1`` step replaced by the last index under ``model``."""
    if "layer.-1." not in name or isinstance(model, str):
        return f"{layers}.*.{name}"
    block = model.get_submodule(layers)[0]
    last = len(block.get_submodule("layer")) - 1
    return f"{layers}.*.{name.replace('layer.-1.', f'layer.{last}.')}"
