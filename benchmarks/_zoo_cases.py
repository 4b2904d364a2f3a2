"""Third-party models for the auto-vs-manual benchmark: HF transformers and timm at benchmark size.

The same architectures as :mod:`benchmarks.models.zoo` (and the losses their users
compute, taken from it: HF's own causal-LM loss with ``F.pad``-shifted labels, masked-LM,
seq2seq, image classification), built from the libraries' config classes with random
weights at the size of the project's own benchmark models (width 128, 2 layers,
sequences of 64). They are planned on the lazy core's IR, the graph AUTO sees, and
measured on the 1x8 and 2x4 meshes. ``hf-mixtral-layer`` is one Mixtral layer at a
realistic width (1024, experts' FFN 3584, 8 experts, top 2), modelled only: the case
where the expert weights, not the tokens, dominate the step.

Example:
    >>> [c.name for c in ZOO_CASES][:3]
    ['hf-gpt2', 'hf-llama', 'hf-gpt-neo']
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from benchmarks._cases import ModelCase
from benchmarks._strategies import TPPlan
from benchmarks.models.zoo import ZOO

VOCAB, SEQ, WIDTH, LAYERS, HEADS = 512, 64, 128, 2, 4
MESHES = ("1x8", "2x4")
Batch = tuple[torch.Tensor, ...]


class WithLoss(nn.Module):
    """``model`` whose forward takes a batch and returns the loss its library's users compute."""

    def __init__(self, model: nn.Module, loss: Callable[[nn.Module, Batch], torch.Tensor]) -> None:
        super().__init__()
        self.model = model
        self._loss = loss

    def forward(self, *batch: torch.Tensor) -> torch.Tensor:
        return self._loss(self.model, batch)


def _ids(bs: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (bs, SEQ), generator=torch.Generator().manual_seed(seed))


def _causal(bs: int) -> Batch:
    return (_ids(bs),)


def _masked(bs: int) -> Batch:
    ids = _ids(bs)
    keep = torch.randint(0, 4, ids.shape, generator=torch.Generator().manual_seed(2)) == 0
    return ids, torch.where(keep, ids, torch.full_like(ids, -100))


def _seq2seq(bs: int) -> Batch:
    return _ids(bs), _ids(bs, seed=2)


def _images(bs: int) -> Batch:
    g = torch.Generator().manual_seed(3)
    return torch.randn(bs, 3, 32, 32, generator=g), torch.randint(0, 16, (bs,), generator=g)


def _hf(cls: str, cfg: str, **kw: Any) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import transformers

        torch.manual_seed(0)
        return getattr(transformers, cls)(getattr(transformers, cfg)(**kw))
    return make


def _vit() -> nn.Module:
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=4, embed_dim=WIDTH,
                             depth=LAYERS, num_heads=HEADS, num_classes=16)


def _case(name: str, make: Callable[[], nn.Module], batch: Callable[[int], Batch], tp: TPPlan,
          zoo: str | None = None, batch_size: int = 16, meshes: tuple[str, ...] = MESHES) -> ModelCase:
    loss = ZOO[zoo or name].loss
    return ModelCase(name, lambda: WithLoss(make(), loss), batch, batch_size, tp, 2, meshes=meshes, ir_graph=True)


def _mixtral(width: int, ffn: int, layers: int, heads: int) -> Callable[[], nn.Module]:
    return _hf("MixtralForCausalLM", "MixtralConfig", vocab_size=VOCAB, hidden_size=width, intermediate_size=ffn,
               num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=2, num_local_experts=8,
               num_experts_per_tok=2, max_position_embeddings=SEQ, router_jitter_noise=0.0)


_MIXTRAL_TP = TPPlan(row=r"o_proj\.weight$", vocab=r"embed_tokens", replicate=r"norm|gate\.weight")


_DROP = dict(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
ZOO_CASES: list[ModelCase] = [
    _case("hf-gpt2", _hf("GPT2LMHeadModel", "GPT2Config", vocab_size=VOCAB, n_positions=SEQ, n_embd=WIDTH,
                         n_layer=LAYERS, n_head=HEADS, **_DROP), _causal,
          TPPlan(row=r"(attn|mlp)\.c_proj\.weight$", vocab=r"\.wte\.", transposed=r"\.(c_attn|c_fc|c_proj)\.")),
    _case("hf-llama", _hf("LlamaForCausalLM", "LlamaConfig", vocab_size=VOCAB, hidden_size=WIDTH,
                          intermediate_size=352, num_hidden_layers=LAYERS, num_attention_heads=HEADS,
                          num_key_value_heads=2, max_position_embeddings=SEQ), _causal,
          TPPlan(row=r"(o_proj|down_proj)\.weight$", vocab=r"embed_tokens"), zoo="hf-llama-cache"),
    _case("hf-gpt-neo", _hf("GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=VOCAB, max_position_embeddings=SEQ,
                            hidden_size=WIDTH, num_layers=LAYERS, num_heads=HEADS, window_size=16,
                            attention_types=[[["global", "local"], LAYERS // 2]], embed_dropout=0.0,
                            attention_dropout=0.0, resid_dropout=0.0), _causal,
          TPPlan(row=r"(out_proj|c_proj)\.weight$", vocab=r"\.wte\.")),
    _case("hf-bert", _hf("BertForMaskedLM", "BertConfig", vocab_size=VOCAB, hidden_size=WIDTH,
                         num_hidden_layers=LAYERS, num_attention_heads=HEADS, intermediate_size=4 * WIDTH,
                         max_position_embeddings=SEQ, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
          _masked, TPPlan(row=r"output\.dense\.weight$", vocab=r"word_embeddings",
                          replicate=r"LayerNorm|position|token_type|cls\.predictions\.transform")),
    _case("hf-t5", _hf("T5ForConditionalGeneration", "T5Config", vocab_size=VOCAB, d_model=WIDTH,
                       d_kv=WIDTH // HEADS, d_ff=4 * WIDTH, num_layers=LAYERS, num_decoder_layers=LAYERS,
                       num_heads=HEADS, relative_attention_num_buckets=8, relative_attention_max_distance=SEQ,
                       dropout_rate=0.0, decoder_start_token_id=0, pad_token_id=0), _seq2seq,
          TPPlan(row=r"\.(o|wo)\.weight$", vocab=r"^model\.shared\.", replicate=r"layer_norm|relative_attention")),
    _case("hf-mixtral", _mixtral(WIDTH, 2 * WIDTH, LAYERS, HEADS), _causal, _MIXTRAL_TP),
    _case("hf-mixtral-layer", _mixtral(1024, 3584, 1, 8), _causal, _MIXTRAL_TP, zoo="hf-mixtral", meshes=()),
    _case("timm-vit", _vit, _images, TPPlan(row=r"(attn\.proj|mlp\.fc2)\.weight$",
                                            replicate=r"norm|pos_embed|cls_token|patch_embed|head"), batch_size=64),
]


def ir_graph(case: ModelCase, batch_size: int) -> Any:
    """The autoshard graph of one training step (AdamW) of ``case``, from the lazy IR, without running it.

    Parameters are named as ``named_parameters`` names them, optimizer state
    ``exp_avg:<param>``, the batch tensors ``input{i}`` (the manual strategies' names).
    """
    import xla_dtensor
    from xla_dtensor.auto import graph_from_ir, step_roles

    dev = xla_dtensor.device()
    torch.manual_seed(0)
    model = case.make().to(dev)
    batch = [t.to(dev) for t in case.batch(batch_size)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(*batch).backward()
    opt.step()
    params, state = step_roles(model, opt)
    return graph_from_ir(params=params, opt_state=state, inputs={t: f"input{i}" for i, t in enumerate(batch)},
                         name=case.name)
