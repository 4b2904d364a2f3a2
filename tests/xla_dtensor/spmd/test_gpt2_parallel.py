"""2-D (data x model) Megatron GPT-2, parallelize_module and FSDP: losses equal the CPU run."""
from __future__ import annotations

import copy
import re

import numpy as np
import pytest
import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import xla_dtensor
import xla_dtensor.spmd as xs
from benchmarks.models import GPT2, GPT2Config
from xla_dtensor.fsdp import shard_model
from tests._train import train

STEPS = 10
COLWISE = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.c_fc")
ROWWISE = ("attn.c_proj", "mlp.c_proj")


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(0)
    cfg = GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    model = GPT2(cfg)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 64, (4, 16), generator=g), torch.randint(0, 64, (4, 16), generator=g))
               for _ in range(STEPS)]
    ref = _train(copy.deepcopy(model), batches)
    return model, batches, ref


def _train(model, batches, shard_batch=None):
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    return train(model, batches, opt, put=shard_batch, sync=xla_dtensor.sync if shard_batch is not None else None)


def _mesh():
    return xs.Mesh(range(8), (2, 4), ("data", "model"))


def _batch_on(mesh):
    def put(t):
        t = t.to(xla_dtensor.device())
        xs.mark_sharding(t, mesh, ("data", None))
        return t
    return put


def _replica_groups(hlo):
    """Device groups of every all-reduce in compiled HLO text (explicit or mesh[...] form)."""
    out = []
    for line in hlo.splitlines():
        if " all-reduce(" not in line and " all-reduce-start(" not in line:
            continue
        m = re.search(r"replica_groups=(\{\{[\d,{}]*\}\})", line)
        if m:
            out.append(frozenset(frozenset(int(x) for x in g.split(",")) for g in re.findall(r"\{([\d,]+)\}", m.group(1))))
            continue
        m = re.search(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}", line)
        sizes = [int(s.split("=")[1]) for s in m.group(1).split(",")]
        names = [s.split("=")[0].strip("'") for s in m.group(1).split(",")]
        red = [names.index(a.strip().strip("'")) for a in m.group(2).split(",") if a.strip()]
        grid = np.arange(int(np.prod(sizes))).reshape(sizes)
        keep = [i for i in range(len(sizes)) if i not in red]
        moved = np.transpose(grid, keep + red).reshape(-1, int(np.prod([sizes[i] for i in red])))
        out.append(frozenset(frozenset(int(x) for x in row) for row in moved))
    return out


MODEL_GROUPS = frozenset({frozenset({0, 1, 2, 3}), frozenset({4, 5, 6, 7})})
DATA_GROUPS = frozenset(frozenset({i, i + 4}) for i in range(4))


def test_megatron_mark_sharding_matches_cpu_and_all_reduces_on_model_axis(setup):
    model, batches, ref = setup
    mesh = _mesh()
    m = copy.deepcopy(model).to(xla_dtensor.device())
    for blk in m.h:
        for name in COLWISE:
            lin = blk.get_submodule(name)
            xs.mark_sharding(lin.weight, mesh, ("model", None))
            xs.mark_sharding(lin.bias, mesh, ("model",))
        for name in ROWWISE:
            xs.mark_sharding(blk.get_submodule(name).weight, mesh, (None, "model"))
    got = _train(m, batches, _batch_on(mesh))
    np.testing.assert_allclose(got, ref, rtol=1e-4)
    step = _replica_groups(xs.last_compiled_hlo())
    assert MODEL_GROUPS in step and set(step) <= {MODEL_GROUPS, DATA_GROUPS, frozenset({frozenset(range(8))})}
    # the forward of one block alone reduces over the model axis only (Megatron: 2 per block)
    x = torch.randn(4, 16, 32).to(xla_dtensor.device())
    xs.mark_sharding(x, mesh, ("data", None, None))
    with torch.no_grad():
        m.h[0](x).cpu()
    fwd = _replica_groups(xs.last_compiled_hlo())
    assert fwd and set(fwd) == {MODEL_GROUPS}, fwd
    assert xs.get_spec(m.h[0].attn.q_proj.weight).to_partition_spec() == ("model", None)


def test_parallelize_module_colwise_rowwise_matches_cpu(setup):
    model, batches, ref = setup
    dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("data", "model"))
    tp = xs.submesh(dm, "model")
    m = copy.deepcopy(model)
    plan = {**{n: ColwiseParallel() for n in COLWISE}, **{n: RowwiseParallel() for n in ROWWISE}}
    for blk in m.h:
        parallelize_module(blk, tp, plan)
    xla_dtensor.distribute_module(m, dm)  # replicate everything the plan did not shard
    w = m.h[0].attn.q_proj.weight
    assert isinstance(w, xs.XLAShardedTensor) and xs.get_spec(w).on_root().to_partition_spec() == ("model", None)
    assert m.lm_head.weight is m.wte.weight  # tied weights stay tied
    got = _train(m, batches, _batch_on(_mesh()))
    np.testing.assert_allclose(got, ref, rtol=1e-4)


def test_fsdp_shard_model_matches_cpu(setup):
    model, batches, ref = setup
    mesh = xs.Mesh(range(8), (8,), ("fsdp",))
    m = shard_model(copy.deepcopy(model), mesh, "fsdp")
    assert xs.get_spec(m.h[0].mlp.c_fc.weight).to_partition_spec() == ("fsdp", None)  # (128, 32)
    assert xs.get_spec(m.h[0].ln_1.weight).to_partition_spec() == ("fsdp",)          # (32,)
    got = _train(m, batches[:4], lambda t: t.to(xla_dtensor.device()))
    np.testing.assert_allclose(got, ref[:4], rtol=1e-4)
    # parameters are still sharded after the optimizer steps
    arr = m.h[0].mlp.c_fc.weight._storage.value.data
    assert {s.data.shape for s in arr.addressable_shards} == {(16, 32)}
