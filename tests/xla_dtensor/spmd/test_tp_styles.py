"""torch's own tensor-parallel styles on DeviceMesh("xla"): the TP tutorial's Megatron plan with and
without sequence parallelism trains like torch CPU on 1x8 and 2x4 meshes (lazy and
``xla_dtensor.compile``), and the compiled step has the collectives sequence parallelism is
for; the other styles against CPU values."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models.llama import Llama, LlamaConfig, make_batch
from tests._train import train
from tests.xla_dtensor.spmd._hlo import collectives

CFG = LlamaConfig(vocab=64, dim=64, n_layers=1, n_heads=8, hidden_dim=128, max_seq=16)
B, T, STEPS = 4, 16, 3


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    model = Llama(CFG)
    g = torch.Generator().manual_seed(1)
    batches = [make_batch(CFG, B, generator=g) for _ in range(STEPS)]
    ref = copy.deepcopy(model)
    losses = train(ref, batches, torch.optim.AdamW(ref.parameters(), lr=1e-2))
    return model, batches, losses, ref


def tutorial_plan(model: Llama, tp, sequence_parallel: bool) -> None:
    """torch's TP tutorial plan (torchtitan's Llama plan), applied with torch's parallelize_module."""
    seq = Shard(1) if sequence_parallel else Replicate()
    top = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=seq),
           "output": ColwiseParallel(input_layouts=seq, output_layouts=Replicate())}
    if sequence_parallel:
        top["norm"] = SequenceParallel()
    parallelize_module(model, tp, top)
    block = {"attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(),
             "attention.wv": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=seq),
             "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
             "feed_forward.w2": RowwiseParallel(output_layouts=seq)}
    if sequence_parallel:
        block.update({
            "attention_norm": SequenceParallel(), "ffn_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None),
                                            desired_input_layouts=(Replicate(), None, None)),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
    for layer in model.layers:
        parallelize_module(layer, tp, block)


def _run(setup, shape, sequence_parallel):
    model, batches, ref_losses, ref = setup
    dm = init_device_mesh("xla", shape, mesh_dim_names=("dp", "tp"))
    m = copy.deepcopy(model)
    tutorial_plan(m, dm["tp"], sequence_parallel)
    xla_dtensor.distribute_module(m, dm)   # nothing left to replicate but the mesh is checked
    assert m.layers[0].attention.wq.weight.placements == (Shard(0),)
    compiles = []

    def sync() -> None:
        xla_dtensor.sync()
        compiles.append(xla_dtensor.metrics.counters()["compiles"])
    losses = train(m, batches, torch.optim.AdamW(m.parameters(), lr=1e-2),
                   put=lambda t: distribute_tensor(t, dm, [Shard(0), Replicate()]), sync=sync)
    hlo = xs.last_compiled_hlo()   # the training step's program
    assert compiles[2] == compiles[1], "the third step compiled again"
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-3)
    for name, p in ref.named_parameters():
        np.testing.assert_allclose(m.get_parameter(name).detach().cpu().numpy(), p.detach().numpy(),
                                   rtol=1e-3, atol=1e-4)
    return collectives(hlo)


def _seq_all_gathers(cols, b):
    return [c for c in cols if c.kind == "all-gather" and c.dims == (1,) and c.shape == (b, T, CFG.dim)]


def _reduce_scatters(cols, b, tp):
    """Real reduce-scatters of a row-split (batch, seq, dim) output to this device's sequence
    shard (``b``: the batch on one device)."""
    return [c for c in cols if c.kind == "reduce-scatter" and c.dims == (1,) and c.shape == (b, T // tp, CFG.dim)]


def _sequence_parallel_collectives(cols, b, tp):
    # forward: the row-split outputs (the embedding, and wo and w2 in every layer) are
    # reduce-scattered to sequence shards, as torch's DTensor does (not all-reduced and sliced) ...
    assert len(_reduce_scatters(cols, b, tp)) >= 2 * CFG.n_layers + 1, cols
    # ... and gathered back before the attention, the MLP and the output projection
    assert len(_seq_all_gathers(cols, b)) >= 3, cols


def test_sequence_parallel_plan_1x8_matches_cpu_and_reduce_scatters(setup):
    _sequence_parallel_collectives(_run(setup, (1, 8), sequence_parallel=True), B, 8)


def test_sequence_parallel_plan_2x4_compiled_step_matches_cpu(setup):
    """The same plan inside ``xla_dtensor.compile``: the styles' layouts are traced into the
    step and replayed for each new batch (a layout change must not move data while tracing)."""
    model, batches, ref_losses, ref = setup
    dm = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    m = copy.deepcopy(model)
    tutorial_plan(m, dm["tp"], sequence_parallel=True)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)

    @xla_dtensor.compile
    def step(idx: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        loss = m(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    losses = [step(*(distribute_tensor(t, dm, [Shard(0), Replicate()]) for t in b)).item() for b in batches]
    # the third loss comes from a replay (steps 1 and 2 trace): it must see the third batch
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-3)
    # the batch stays split over "dp" through the reduce-scatters (2 rows per device)
    _sequence_parallel_collectives(collectives(xs.last_compiled_hlo()), B // 2, 4)


def test_megatron_plan_without_sequence_parallel_2x4_all_reduces(setup):
    cols = _run(setup, (2, 4), sequence_parallel=False)
    # the row-split linear's (batch, seq, dim) output, whole (flattened where torch's decomposition ran)
    full = {(B // 2 * T, CFG.dim), (B // 2, T, CFG.dim)}
    assert [c for c in cols if c.kind == "all-reduce" and c.shape in full], cols
    assert not _seq_all_gathers(cols, B // 2) and not _reduce_scatters(cols, B // 2, 4), cols


# -- the other styles, one module each ---------------------------------------------------
class TwoIn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x) * scale, x.sum(-1)


def test_prepare_module_input_output_with_kwargs_and_dtensor_outputs():
    torch.manual_seed(0)
    mod, x, scale = TwoIn(), torch.randn(8, 8), torch.randn(8, 1)
    want = mod(x, scale=scale)
    dm = init_device_mesh("xla", (8,))
    m = copy.deepcopy(mod)
    parallelize_module(m, dm, PrepareModuleInputOutput(
        input_layouts=(Shard(0),), desired_input_layouts=(Replicate(),),
        input_kwarg_layouts={"scale": Shard(0)}, desired_input_kwarg_layouts={"scale": Replicate()},
        output_layouts=(Replicate(), None), desired_output_layouts=(Shard(0), None), use_local_output=False))
    xla_dtensor.distribute_module(m, dm)
    out, rest = m(x.to(xla_dtensor.device()), scale=scale.to(xla_dtensor.device()))
    assert isinstance(out, xs.XLAShardedTensor) and out.placements == (Shard(0),)
    torch.testing.assert_close(out.full_tensor().cpu(), want[0].detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rest.cpu(), want[1])
    m2 = copy.deepcopy(mod)
    parallelize_module(m2, dm, PrepareModuleOutput(output_layouts=(Replicate(), Replicate()),
                                                   desired_output_layouts=(Shard(0), Shard(0))))
    xla_dtensor.distribute_module(m2, dm)
    out2, _ = m2(x.to(xla_dtensor.device()), scale=scale.to(xla_dtensor.device()))
    assert type(out2) is xla_dtensor.LazyTensor   # use_local_output=True: the global value, plain
    torch.testing.assert_close(out2.cpu(), want[0].detach(), rtol=1e-5, atol=1e-5)


def test_dtensor_outputs_of_colwise_and_a_partial_rowwise_output():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    want = mlp(x)
    dm = init_device_mesh("xla", (8,))
    m = copy.deepcopy(mlp)
    parallelize_module(m, dm, {"0": ColwiseParallel(use_local_output=False),
                               "2": RowwiseParallel(output_layouts=Partial(), use_local_output=False)})
    h = m[0](x.to(xla_dtensor.device()))
    assert isinstance(h, xs.XLAShardedTensor) and h.placements == (Shard(1),)
    out = m[2](m[1](h))
    assert out.placements == (Partial(),)   # a pending reduction, carried
    torch.testing.assert_close(out.redistribute(dm, [Replicate()]).to_local().cpu(), want.detach(),
                               rtol=1e-5, atol=1e-5)


def test_loss_parallel_keeps_logits_vocab_sharded_and_matches_cpu():
    torch.manual_seed(0)
    head, x, y = nn.Linear(16, 64, bias=False), torch.randn(32, 16), torch.randint(0, 64, (32,))
    F.cross_entropy(head(x), y).backward()
    dm = init_device_mesh("xla", (8,))
    m = copy.deepcopy(head)
    m.weight.grad = None
    parallelize_module(m, dm, ColwiseParallel(output_layouts=Shard(-1), use_local_output=False))
    with loss_parallel():
        logits = m(x.to(xla_dtensor.device()))
        assert logits.placements == (Shard(1),)
        loss = F.cross_entropy(logits, y.to(xla_dtensor.device()))
        loss.backward()
    xla_dtensor.sync()
    hlo = xs.last_compiled_hlo()
    torch.testing.assert_close(loss.cpu(), F.cross_entropy(head(x), y).detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m.weight.grad.cpu(), head.weight.grad, rtol=1e-4, atol=1e-5)
    # the (32, 64) logits are never gathered: only per-row statistics cross the devices
    assert not [c for c in collectives(hlo) if c.kind == "all-gather" and 64 in c.shape and 32 in c.shape]


def test_rowwise_sequence_sharded_outputs_reduce_scatter_with_bias_and_train_like_cpu():
    """RowwiseParallel(output_layouts=Shard(1)) on a biased linear and an embedding, the batch
    split on "dp": real reduce-scatters in the forward, values and every gradient as on CPU;
    a sequence the tp axis does not divide takes the constraint (XLA's collectives), same values."""
    torch.manual_seed(0)
    lin, emb = nn.Linear(16, 8), nn.Embedding(16, 8)
    x, ids, w = torch.randn(4, 8, 16), torch.randint(0, 16, (4, 8)), torch.randn(4, 8, 8)
    uneven, xr = torch.randn(4, 6, 16), x.clone().requires_grad_()
    want = lin(xr) * emb(ids)
    ((want * w).sum() + lin(uneven).square().sum()).backward()
    dm = init_device_mesh("xla", (2, 4), mesh_dim_names=("dp", "tp"))
    ml, me = copy.deepcopy(lin), copy.deepcopy(emb)
    for p in (*ml.parameters(), *me.parameters()):
        p.grad = None
    parallelize_module(ml, dm["tp"], RowwiseParallel(output_layouts=Shard(1)))
    parallelize_module(me, dm["tp"], RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)))
    put = lambda t: distribute_tensor(t, dm, [Shard(0), Replicate()])  # noqa: E731
    xd = put(x).requires_grad_()
    out = ml(xd) * me(put(ids))
    ((out * put(w)).sum() + ml(put(uneven)).square().sum()).backward()
    xla_dtensor.sync()
    cols = collectives(xs.last_compiled_hlo())
    assert len([c for c in cols if c.kind == "reduce-scatter" and c.shape == (2, 2, 8) and c.dims == (1,)]) == 2, cols
    torch.testing.assert_close(out.detach().cpu(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xd.grad.cpu(), xr.grad, rtol=1e-5, atol=1e-5)
    for got, want in ((ml.weight, lin.weight), (ml.bias, lin.bias), (me.weight, emb.weight)):
        torch.testing.assert_close(got.grad.cpu(), want.grad, rtol=1e-4, atol=1e-5)
