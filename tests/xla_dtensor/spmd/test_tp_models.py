"""Megatron plans through torch's ``parallelize_module`` on models nobody here wrote: HF
transformers (tiny configs, random weights) and torchtitan's Llama with its own TP code,
on DeviceMesh("xla"); AdamW steps (or a step's loss and gradients) against torch CPU."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import loss_parallel

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models.torchvision_shim import install as _shim
from tests._train import train

pytest.importorskip("transformers")
_shim()  # transformers imports torchvision, whose CUDA wheel's C++ ops do not load on CPU torch
V, B, T, STEPS = 64, 4, 16, 3


def _hf(kind: str) -> nn.Module:
    import transformers as tr
    torch.manual_seed(0)
    small = dict(vocab_size=V)
    if kind == "gpt2":
        return tr.GPT2LMHeadModel(tr.GPT2Config(**small, n_positions=T, n_embd=32, n_layer=1, n_head=4,
                                                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                                bos_token_id=V - 1, eos_token_id=V - 1))
    if kind == "llama":
        return tr.LlamaForCausalLM(tr.LlamaConfig(**small, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=4, num_key_value_heads=2,
                                                  max_position_embeddings=T, use_cache=False))
    if kind == "gpt_neo":
        return tr.GPTNeoForCausalLM(tr.GPTNeoConfig(**small, max_position_embeddings=T, hidden_size=32, num_layers=2,
                                                    num_heads=4, attention_types=[[["global", "local"], 1]]))
    if kind == "bert":
        return tr.BertForMaskedLM(tr.BertConfig(**small, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                                                intermediate_size=64, max_position_embeddings=T))
    if kind == "t5":
        return tr.T5ForConditionalGeneration(tr.T5Config(**small, d_model=32, d_kv=8, d_ff=64, num_layers=1,
                                                         num_decoder_layers=1, num_heads=4, decoder_start_token_id=0))
    return tr.MixtralForCausalLM(tr.MixtralConfig(**small, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                                  num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                                  max_position_embeddings=T))


@pytest.mark.parametrize("kind", ["gpt2", "llama", "gpt_neo", "bert", "t5", "mixtral"])
def test_megatron_plan_resolves_and_splits_every_family(kind):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from xla_dtensor.spmd.plans import FAMILIES, megatron_plan
    tp = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))["tp"]
    for sp in (False, True) if all(f.norms for f in (FAMILIES[kind] if isinstance(FAMILIES[kind], tuple)
                                                        else (FAMILIES[kind],))) else (False,):
        model = _hf(kind)
        plan = megatron_plan(model, sequence_parallel=sp)
        xs.parallelize_module(model, tp, plan)   # strict: every key must name submodules
        for key, style in plan.items():
            if not isinstance(style, (ColwiseParallel, RowwiseParallel)):
                continue
            conv1d = type(style).__name__.startswith("Conv1D")
            want = (Shard(0),) if isinstance(style, ColwiseParallel) != conv1d else (Shard(1),)
            for _, sub in xs.parallelize._resolve(model, key):
                assert sub.weight.placements == want, (kind, key)


def _train_tp(kind: str, shape: tuple[int, int], sequence_parallel: bool) -> None:
    from xla_dtensor.spmd.plans import megatron_plan
    model = _hf(kind)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, V, (B, T), generator=g),) for _ in range(STEPS)]
    loss_of = lambda m: (lambda ids: m(input_ids=ids, labels=ids).loss)  # noqa: E731
    ref = copy.deepcopy(model)
    want = train(loss_of(ref), batches, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    dm = init_device_mesh("xla", shape, mesh_dim_names=("dp", "tp"))
    m = copy.deepcopy(model)
    torch.distributed.tensor.parallel.parallelize_module(m, dm["tp"], megatron_plan(m, sequence_parallel))
    xla_dtensor.distribute_module(m, dm)   # embeddings, norms, lm_head: replicated
    got = train(loss_of(m), batches, torch.optim.AdamW(m.parameters(), lr=1e-2),
                put=lambda t: distribute_tensor(t, dm, [Shard(0), Replicate()]), sync=xla_dtensor.sync)
    np.testing.assert_allclose(got, want, rtol=1e-3)


def test_hf_llama_sequence_parallel_2x4_trains_like_cpu():
    _train_tp("llama", (2, 4), sequence_parallel=True)


def test_hf_gpt2_conv1d_megatron_1x8_loss_and_gradients_like_cpu():
    from xla_dtensor.spmd.plans import megatron_plan
    model, ids = _hf("gpt2"), torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(1))
    dm = init_device_mesh("xla", (1, 8), mesh_dim_names=("dp", "tp"))
    m = copy.deepcopy(model)
    torch.distributed.tensor.parallel.parallelize_module(m, dm["tp"], megatron_plan(m))
    xla_dtensor.distribute_module(m, dm)
    assert m.transformer.h[0].attn.c_attn.weight.placements == (Shard(1),)   # Conv1D: (in, out)
    loss = m(input_ids=distribute_tensor(ids, dm, [Replicate(), Replicate()]), labels=ids.to(xla_dtensor.device())).loss
    loss.backward()
    xla_dtensor.sync()
    want = model(input_ids=ids, labels=ids).loss
    want.backward()
    np.testing.assert_allclose(loss.item(), want.item(), rtol=1e-4)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(m.get_parameter(name).grad.cpu().numpy(), p.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)


def _complex_lowered() -> bool:
    from xla_dtensor.ops.registry import get_lowering
    return get_lowering(torch.ops.aten.view_as_complex.default) is not None


@pytest.mark.skipif(not _complex_lowered(), reason="torchtitan's complex rotary needs the view_as_complex "
                                                   "lowering (the lowerings branch)")
def test_torchtitan_parallelize_llama_with_its_own_meshes_and_loss_parallel(monkeypatch):
    pytest.importorskip("torchtitan")
    import torchtitan.distributed.parallel_dims as pd
    from torchtitan.config import JobConfig
    from torchtitan.distributed import ParallelDims
    from torchtitan.models.llama3.infra.parallelize import parallelize_llama
    from torchtitan.models.llama3.model.args import TransformerModelArgs
    from torchtitan.models.llama3.model.model import Transformer

    monkeypatch.setattr(pd, "device_type", "xla")   # torchtitan picks "cuda"/"cpu" itself
    torch.manual_seed(0)
    model = Transformer(TransformerModelArgs(dim=64, n_layers=1, n_heads=4, n_kv_heads=2, vocab_size=V,
                                             max_seq_len=T, rope_theta=500000))
    with torch.no_grad():
        model.init_weights()
    ids = torch.randint(0, V, (B, T + 1), generator=torch.Generator().manual_seed(1))

    def loss_of(m: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        with loss_parallel():
            loss = F.cross_entropy(m(ids[:, :-1]).flatten(0, 1).float(), ids[:, 1:].flatten())
            loss.backward()
        return loss
    want = loss_of(model, ids)
    dims = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=8, pp=1, ep=1, etp=1, world_size=8)
    world = dims.build_mesh()   # torchtitan's _unflatten / slicing / _flatten on an xla mesh
    job = JobConfig()
    job.activation_checkpoint.mode, job.training.seq_len = "none", T
    m = copy.deepcopy(model)
    for p in m.parameters():
        p.grad = None
    parallelize_llama(m, dims, job)   # torchtitan's TP plan, loss parallel on
    xla_dtensor.distribute_module(m, world)
    assert m.output.weight.placements == (Shard(0),) and m.layers["0"].attention_norm.weight.placements == (Replicate(),)
    got = loss_of(m, distribute_tensor(ids, world, [Replicate()]))
    xla_dtensor.sync()
    np.testing.assert_allclose(got.item(), want.item(), rtol=1e-4)
    for name, p in model.named_parameters():
        np.testing.assert_allclose(m.get_parameter(name).grad.cpu().numpy(), p.grad.numpy(), rtol=1e-3, atol=1e-5,
                                   err_msg=name)
    # torchtitan's FSDP2 / DDP need process groups, which an xla mesh has none of: a named error
    fsdp = ParallelDims(dp_replicate=1, dp_shard=2, cp=1, tp=4, pp=1, ep=1, etp=1, world_size=8)
    fsdp.build_mesh()
    with pytest.raises(RuntimeError, match=r"'xla' mesh: it has no process groups.*FSDP2 fully_shard"):
        parallelize_llama(copy.deepcopy(model), fsdp, job)
