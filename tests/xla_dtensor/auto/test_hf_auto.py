"""AUTO on HF GPT-2 (its own loss), Llama (KV cache on) and Mixtral: plans that shard, training equal to torch CPU.

Each model (one-layer configs from transformers' config classes, random weights; the
integration matrix trains the two-layer ones of :mod:`benchmarks.models.zoo`) trains two
AdamW steps through ``distribute_module(model, mesh, partition_fn=AutoPolicy(...))`` on
1x8 and 2x4 meshes. The batch (64 x 16 tokens) is large enough that data parallelism
pays in the TPU v5e cost model, so a plan that replicates every parameter and input
there is a failure of the planner (the plan-quality guard), not a modelling choice.
"""
from __future__ import annotations

import copy

import pytest
import torch

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models import zoo  # noqa: F401  (installs the torchvision shim transformers' Mixtral needs)
from tests._train import train

MESHES = {"1x8": (1, 8), "2x4": (2, 4)}
VOCAB, STEPS, BATCH, SEQ = 128, 2, 64, 16


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=1, n_head=4,
                                      resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))


def _llama() -> torch.nn.Module:  # GQA, use_cache=True (the default): the forward returns KV-cache tensors
    from transformers import LlamaConfig, LlamaForCausalLM
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ))


def _mixtral() -> torch.nn.Module:
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                            num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=SEQ,
                                            router_jitter_noise=0.0))


MODELS = {"gpt2": _gpt2, "llama": _llama, "mixtral": _mixtral}


def _batches() -> list[tuple[torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),) for _ in range(STEPS)]


def _run(model, dev=None) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    put = (lambda t: t.to(dev)) if dev is not None else None
    return train(lambda ids: model(input_ids=ids, labels=ids).loss, _batches(), opt, put=put,  # HF's own loss
                 sync=xla_dtensor.sync if dev is not None else None)


@pytest.fixture(scope="module")
def case(request):
    torch.manual_seed(0)
    model = MODELS[request.param]()
    return model, _run(copy.deepcopy(model))


# NOTE: Llama and Mixtral on 1x8 run with ``-m slow`` (~16 s of the default run): GPT-2 keeps the 1x8 mesh
# here, and the integration matrix trains the zoo's Llama and Mixtral under AUTO on 2x4
CASES = [pytest.param(name, mesh, id=f"{name}-{mesh}",
                      marks=[pytest.mark.slow] if mesh == "1x8" and name != "gpt2" else [])
         for name in MODELS for mesh in MESHES]


@pytest.mark.parametrize("case,mesh", CASES, indirect=["case"])
def test_auto_shards_and_trains_like_cpu(case, mesh, dev):
    base, ref = case
    m = xs.Mesh(range(8), MESHES[mesh], ("data", "model"))
    model = xs.distribute_module(copy.deepcopy(base), m, partition_fn=xs.AutoPolicy(time_limit=30, topology="tpu-v5e"))
    got = _run(model, dev)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-3, atol=1e-5)
    plan = model._auto_plan
    guard = plan.stats["guard"]
    assert guard["dp_feasible"] and not guard["all_replicated"], plan.explain()
    sharded = [k for k, r in plan.roles.items() if r in ("param", "input") and any(p != "R" for p in plan.placements[k])]
    assert sharded, plan.explain()
    assert plan.stats["unknown_ops"] == []
    assert plan.objective <= guard["replicated_cost"]
