"""Third-party models in tiny configurations: HF transformers, timm, torchtitan.

Each :class:`ZooModel` builds a model nobody on this project wrote, from its library's
own config class with random weights (never a hub download), a batch for a training
step, the loss that library's users compute, and the Megatron tensor-parallel plan a
torch user would write for it with ``parallelize_module``. The integration matrix
(``tests/integration``) and the benchmarks train them in every mode.

Example:
    >>> m = ZOO["hf-gpt2"]
    >>> model = m.build()
    >>> loss = m.loss(model, m.batch(0))
    >>> loss.dim(), m.family
    (0, 'HF transformers')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from benchmarks.models.torchvision_shim import install as _install_torchvision_shim

_install_torchvision_shim()  # timm and transformers' Mixtral import torchvision (see that module)

__all__ = ["ZOO", "ZooModel", "VOCAB", "SEQ", "BATCH", "torchvision_unavailable"]

VOCAB, SEQ, BATCH = 128, 8, 8
Batch = tuple[torch.Tensor, ...]
Plan = dict[str, Any]


@dataclass(frozen=True)
class ZooModel:
    """One third-party model: how to build it, feed it and (optionally) tensor-parallelize it.

    ``tp_plan(model, sequence_parallel)``: the Megatron ``parallelize_module`` plan
    (module path -> torch style; :func:`xla_dtensor.spmd.plans.megatron_plan` for HF
    models); it raises ``ValueError`` where the family has no sequence-parallel plan,
    and is ``None`` when the model has no Megatron plan at all (a CNN). ``own_tp``: the
    library's own TP function ``fn(model, tp_mesh)`` (torchtitan's ``apply_tp``).
    """

    name: str
    family: str
    build: Callable[[], nn.Module]
    batch: Callable[[int], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor]
    tp_plan: Callable[[nn.Module, bool], Plan] | None = None
    own_tp: Callable[[nn.Module, Any], None] | None = None
    notes: str = ""
    needs: tuple[str, ...] = field(default=())


def _ids(step: int, *shape: int, high: int = VOCAB) -> torch.Tensor:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, high, shape or (BATCH, SEQ), generator=g)


def _seeded(fn: Callable[[], nn.Module]) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        torch.manual_seed(0)
        return fn()
    build.__doc__ = fn.__doc__
    return build


# -- HF transformers ----------------------------------------------------------------------
def _causal_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss  # HF's own loss: labels shifted with F.pad


def _causal_batch(step: int) -> Batch:
    return (_ids(step),)


def _hf_plan(model: nn.Module, sequence_parallel: bool) -> Plan:
    from xla_dtensor.spmd.plans import megatron_plan
    return megatron_plan(model, sequence_parallel)


@_seeded
def _gpt2() -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=32, n_layer=1, n_head=4, resid_pdrop=0.0,
                     bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1,
                     embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg)


def _llama_cfg(use_cache: bool) -> Any:
    from transformers import LlamaConfig
    return LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                       use_cache=use_cache)


def _llama(use_cache: bool) -> Callable[[], nn.Module]:
    @_seeded
    def build() -> nn.Module:
        from transformers import LlamaForCausalLM
        return LlamaForCausalLM(_llama_cfg(use_cache))
    return build


@_seeded
def _gpt_neo() -> nn.Module:
    from transformers import GPTNeoConfig, GPTNeoForCausalLM
    cfg = GPTNeoConfig(vocab_size=VOCAB, max_position_embeddings=16, hidden_size=32, num_layers=2, num_heads=4,
                       attention_types=[[["global", "local"], 1]], window_size=4, embed_dropout=0.0,
                       attention_dropout=0.0, resid_dropout=0.0)
    return GPTNeoForCausalLM(cfg)


@_seeded
def _bert() -> nn.Module:
    from transformers import BertConfig, BertForMaskedLM
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                     intermediate_size=64, max_position_embeddings=16, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0)
    return BertForMaskedLM(cfg)


def _bert_batch(step: int) -> Batch:
    ids = _ids(step)
    labels = torch.where(_ids(step + 500, high=4) == 0, ids, torch.full_like(ids, -100))  # ~1/4 masked positions
    return ids, labels


def _bert_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids, labels = batch
    return model(input_ids=ids, labels=labels).loss


@_seeded
def _t5() -> nn.Module:
    from transformers import T5Config, T5ForConditionalGeneration
    cfg = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                   decoder_start_token_id=0, pad_token_id=0)
    return T5ForConditionalGeneration(cfg)


def _t5_batch(step: int) -> Batch:
    return _ids(step), _ids(step + 500)


def _t5_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    ids, labels = batch
    return model(input_ids=ids, labels=labels).loss  # decoder inputs: labels shifted right by HF


@_seeded
def _mixtral() -> nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                        max_position_embeddings=16, router_jitter_noise=0.0)
    return MixtralForCausalLM(cfg)


def _moe_batch(step: int) -> Batch:
    """32 sequences (256 tokens): the top-k routing sorts every token's expert ids at once, so splitting
    the batch costs collectives around the sort; with 64 tokens they outweigh the split compute and
    AUTO's modelled optimum is to replicate (``plan.explain()`` says so), from ~256 it is data parallel."""
    return (_ids(step, 4 * BATCH, SEQ),)


# -- timm ---------------------------------------------------------------------------------
_TV_ERROR: list[str] = []


def torchvision_unavailable() -> str | None:
    """Why timm cannot be imported here (``None`` when it can).

    timm imports torchvision; the only torchvision wheel on PyPI for this torch is a CUDA
    build whose C++ ops do not load on CPU torch: importing this module defines the
    missing op schemas first (:mod:`benchmarks.models.torchvision_shim`).
    """
    if not _TV_ERROR:
        try:
            import timm  # noqa: F401
            _TV_ERROR.append("")
        except Exception as e:  # noqa: BLE001  (any import failure is the reason to report)
            _TV_ERROR.append(f"timm does not import: {type(e).__name__}: {e}")
    return _TV_ERROR[0] or None


def _images(step: int, size: int = 32) -> Batch:
    g = torch.Generator().manual_seed(2000 + step)
    return torch.randn(BATCH, 3, size, size, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def _small_images(step: int) -> Batch:
    return _images(step, 16)


def _cls_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


@_seeded
def _vit() -> nn.Module:
    import timm
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=1,
                             num_classes=10)


def _vit_plan(model: nn.Module, sequence_parallel: bool) -> Plan:
    """Megatron on timm's ViT blocks: qkv and fc1 column-split, proj and fc2 row-split; with
    sequence parallelism the norms run on token shards and attn/mlp gather their input."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel)

    row = (lambda: RowwiseParallel(output_layouts=Shard(1))) if sequence_parallel else RowwiseParallel
    plan: Plan = {"blocks.*.attn.qkv": ColwiseParallel(), "blocks.*.mlp.fc1": ColwiseParallel(),
                  "blocks.*.attn.proj": row(), "blocks.*.mlp.fc2": row()}
    if sequence_parallel:
        for norm in ("norm1", "norm2"):
            plan[f"blocks.*.{norm}"] = SequenceParallel()
        for mod in ("attn", "mlp"):
            plan[f"blocks.*.{mod}"] = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
    return plan


@_seeded
def _resnet() -> nn.Module:
    import timm
    return timm.create_model("resnet18", pretrained=False, num_classes=10)


# -- torchtitan ---------------------------------------------------------------------------
@_seeded
def _titan() -> nn.Module:
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer
    args = TransformerModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=VOCAB, max_seq_len=16,
                                rope_theta=500000)
    model = Transformer(args)
    with torch.no_grad():
        model.init_weights()
    return model


def _titan_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    (ids,) = batch
    logits = model(ids[:, :-1])
    return nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())


def _titan_tp(model: nn.Module, tp_mesh: Any) -> None:
    from torchtitan.models.llama3.infra.parallelize import apply_tp
    apply_tp(model, tp_mesh, loss_parallel=False, enable_float8_tensorwise_tp=False)


_HF = "HF transformers"
ZOO: dict[str, ZooModel] = {m.name: m for m in (
    ZooModel("hf-gpt2", _HF, _gpt2, _causal_batch, _causal_loss, _hf_plan,
             notes="GPT2LMHeadModel; Conv1D projections (c_attn is q|k|v fused)"),
    ZooModel("hf-llama", _HF, _llama(False), _causal_batch, _causal_loss, _hf_plan,
             notes="LlamaForCausalLM, GQA (4 heads, 2 KV heads), use_cache=False"),
    ZooModel("hf-llama-cache", _HF, _llama(True), _causal_batch, _causal_loss, _hf_plan,
             notes="LlamaForCausalLM, GQA, use_cache=True (the forward returns KV-cache tensors)"),
    ZooModel("hf-gpt-neo", _HF, _gpt_neo, _causal_batch, _causal_loss, _hf_plan,
             notes="GPTNeoForCausalLM, global + local attention layers, use_cache=True"),
    ZooModel("hf-bert", _HF, _bert, _bert_batch, _bert_loss, _hf_plan, notes="BertForMaskedLM"),
    ZooModel("hf-t5", _HF, _t5, _t5_batch, _t5_loss, _hf_plan,
             notes="T5ForConditionalGeneration, encoder-decoder, relative position buckets, use_cache=True"),
    ZooModel("hf-mixtral", _HF, _mixtral, _moe_batch, _causal_loss, _hf_plan,
             notes="MixtralForCausalLM, 4 experts top-2 (MoE routing: topk, sort, histc, _grouped_mm), 32x8 tokens"),
    ZooModel("timm-vit", "timm", _vit, _images, _cls_loss, _vit_plan,
             notes="vit_tiny_patch16_224 at img_size=32, patch 8, depth 1", needs=("timm",)),
    ZooModel("timm-resnet18", "timm", _resnet, _small_images, _cls_loss, None,
             notes="resnet18 (BatchNorm, num_batches_tracked buffers), 16x16 images", needs=("timm",)),
    ZooModel("titan-llama", "torchtitan", _titan, _causal_batch, _titan_loss, None, own_tp=_titan_tp,
             notes="torchtitan 0.2 Llama 3 (complex rotary, SDPA), dim 64, 1 layer; TP: torchtitan's apply_tp"),
)}
