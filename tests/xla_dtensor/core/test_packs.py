"""Packed state (xla_dtensor/core/packs.py): a sync's updated tensors leave as one array per (dtype, layout).

Oracles: numpy for values and for the shard-major row order (the blocks each device holds,
from JAX's own ``addressable_shards``); torch CPU eager for training (the shared sharded-MLP
loop and HF GPT-2 under 2x4 Megatron TP); the executable's HLO for collectives; a weak reference for an old pack's
release.
"""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest
import torch

import xla_dtensor
import xla_dtensor.spmd as xs
from tests._train import MLP_BATCHES, sharded_mlp_like_cpu
from xla_dtensor import metrics
from xla_dtensor.core import packs
from xla_dtensor.core.executor import last_executable
from xla_dtensor.core.tensor import value_of

DEV = xla_dtensor.device()


def _pack(t: torch.Tensor) -> packs.Pack | None:
    raw = value_of(t).raw
    return raw if type(raw) is packs.Pack else None


def _executions() -> int:
    return metrics.counters()["executions"]


@pytest.fixture
def mesh_packs():
    """Tensors laid out on a mesh packed too (``config.pack_mesh_state``, off by default)."""
    xla_dtensor.config.pack_mesh_state = True
    yield
    xla_dtensor.config.pack_mesh_state = False


@pytest.fixture
def state() -> tuple[list[torch.Tensor], list[np.ndarray]]:
    """Three float tensors on one device, updated in place once and synced (so packed), and numpy's copies."""
    host = [np.arange(12, dtype=np.float32).reshape(3, 4) + i for i in range(3)]
    ts = [torch.from_numpy(h.copy()).to(DEV) for h in host]
    for t, h in zip(ts, host):
        t.mul_(2)
        h *= 2
    xla_dtensor.sync()
    return ts, host


def test_one_sync_packs_updated_tensors_and_reads_them_back(state: tuple) -> None:
    ts, host = state
    pack = _pack(ts[0])
    assert pack is not None and all(_pack(t) is pack for t in ts)
    assert pack.array.shape == (1, 36)
    before = _executions()
    for t, h in zip(ts, host):
        np.testing.assert_array_equal(t.cpu().numpy(), h)
    assert _executions() - before <= 1  # the whole pack unpacked once, not once per tensor


def test_a_second_sync_with_nothing_pending_runs_nothing(state: tuple) -> None:
    before = _executions()
    xla_dtensor.sync()
    assert _executions() == before


def test_next_step_reads_members_and_frees_the_old_pack(state: tuple) -> None:
    """The next step reads the old pack's members and writes a new pack; the old one is freed with its last member
    (never donated: see test_donation_pairing)."""
    ts, host = state
    old = weakref.ref(_pack(ts[0]))
    for t, h in zip(ts, host):
        t.add_(t * 0.5)
        h += h * 0.5
    xla_dtensor.sync()
    new = _pack(ts[0])
    assert new is not None and new is not old() and all(_pack(t) is new for t in ts)
    gc.collect()
    assert old() is None
    for t, h in zip(ts, host):
        np.testing.assert_allclose(t.cpu().numpy(), h)


def test_a_member_left_alone_keeps_its_pack_alive(state: tuple) -> None:
    ts, host = state
    old = _pack(ts[2])
    ts[0].add_(1)
    ts[1].add_(1)
    xla_dtensor.sync()
    assert _pack(ts[2]) is old and not old.array.is_deleted()
    np.testing.assert_array_equal(ts[0].cpu().numpy(), host[0] + 1)
    np.testing.assert_array_equal(ts[2].cpu().numpy(), host[2])


def test_off_keeps_one_array_per_tensor() -> None:
    xla_dtensor.config.pack_state = False
    try:
        a, b = torch.ones(4, device=DEV), torch.ones(4, device=DEV)
        xla_dtensor.sync()
        a.add_(1)
        b.add_(2)
        xla_dtensor.sync()
        assert _pack(a) is None and _pack(b) is None
    finally:
        xla_dtensor.config.pack_state = True


@pytest.mark.parametrize("spec", [("data", None), (None, "model"), ("data", "model"), ("model", "data"),
                                  (("data", "model"), None), (None, None)])
def test_shard_major_rows_are_each_devices_blocks(spec: tuple, mesh_packs: None) -> None:
    """Row r of a packed (8, 16) tensor is what device r of the pack's row axes holds, in JAX's own layout."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model")).jax_mesh()
    sh = NamedSharding(mesh, PartitionSpec(*spec))
    gkey, split = packs._group_key(sh, (8, 16))
    lay = packs._layout(torch.float32, gkey, [(8, 16)], [sh], [split])
    x = np.arange(128, dtype=np.float32).reshape(8, 16)
    rows = np.asarray(jax.jit(lambda v: packs._to_rows(v, split, lay.rows))(x))
    assert rows.shape == (lay.rows, 128 // lay.rows)
    placed = jax.device_put(x, sh)
    packed = jax.device_put(rows, lay.sharding)
    for want, got in zip(sorted(placed.addressable_shards, key=lambda s: s.device.id),
                         sorted(packed.addressable_shards, key=lambda s: s.device.id)):
        np.testing.assert_array_equal(np.asarray(got.data).reshape(-1), np.asarray(want.data).reshape(-1))
    back = jax.jit(lambda r: packs._from_rows(r, (8, 16), split))(rows)
    np.testing.assert_array_equal(np.asarray(back), x)


def test_sharded_packs_keep_layouts_and_move_nothing(mesh_packs: None) -> None:
    """Two tensors in each of five layouts over a 2x4 mesh: each pair shares a pack (split over the same mesh
    axes in the same order), the step's program has no collective, and every tensor reads back in its layout."""
    from jax.sharding import NamedSharding, PartitionSpec
    mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
    specs = [("data", None), (None, "model"), ("data", "model"), ("model", "data"), (None, None)]
    rng = np.random.default_rng(0)
    host = {(spec, i): rng.standard_normal((8, 16)).astype(np.float32) for spec in specs for i in range(2)}
    ts = {}
    for key, h in host.items():
        t = torch.from_numpy(h.copy()).to(DEV)
        xs.mark_sharding(t, mesh, key[0])
        ts[key] = t
    for _ in range(3):
        for key, t in ts.items():
            t.mul_(0.5).add_(1)
            host[key] = host[key] * np.float32(0.5) + np.float32(1)
        xla_dtensor.sync()
    text = last_executable().as_text()
    for op in ("all-gather", "all-reduce", "collective-permute", "all-to-all", "reduce-scatter"):
        assert op not in text
    for spec in specs:
        assert _pack(ts[spec, 0]) is not None and _pack(ts[spec, 0]) is _pack(ts[spec, 1])
    assert len({id(_pack(t)) for t in ts.values()}) == len(specs)
    for (spec, _), t in ts.items():
        np.testing.assert_allclose(t.cpu().numpy(), host[spec, _], rtol=1e-6)
        want = NamedSharding(mesh.jax_mesh(), PartitionSpec(*spec))
        assert value_of(t).data.sharding.is_equivalent_to(want, 2)


@pytest.mark.parametrize("mode,packed", [("dp", 0), ("megatron", 1), ("fsdp", 2), ("auto", 2)])
def test_sharded_training_packs_and_matches_torch_cpu(mode: str, packed: int, mesh_packs: None) -> None:
    """With mesh packing on, the biases with a sticky layout are packed (with their optimizer state, which
    takes their layout: a group of one is not packed). The weights are matrix operands and stay arrays; DP's
    parameters have no sticky layout and are left alone. Off, the default, none is packed."""
    model, _ = sharded_mlp_like_cpu(mode, DEV, _executions)
    assert len(MLP_BATCHES) >= 3
    assert sum(_pack(p) is not None for p in model.parameters()) == packed
    assert all(_pack(m.weight) is None for m in (model[0], model[2]))
    xla_dtensor.config.pack_mesh_state = False
    model, _ = sharded_mlp_like_cpu(mode, DEV, _executions)
    assert all(_pack(p) is None for p in model.parameters())


def test_hf_gpt2_megatron_packs_and_matches_torch_cpu(mesh_packs: None) -> None:
    from tests.xla_dtensor.ops._attention_models import cpu_losses, device_losses, hf_gpt2, hf_loss, tp_2x4
    torch.manual_seed(1)
    batches = [(torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))) for _ in range(3)]
    want = cpu_losses(hf_gpt2(1, "sdpa"), hf_loss, batches)
    seen: list[int] = []
    original = packs.Outputs.leaves

    def count(self: packs.Outputs, *args: object) -> list:
        seen.append(sum(len(ks) for _, ks in self.groups))
        return original(self, *args)
    packs.Outputs.leaves = count  # type: ignore[method-assign]
    try:
        got, _ = device_losses(hf_gpt2(1, "sdpa"), hf_loss, batches, "lazy", tp_2x4)
    finally:
        packs.Outputs.leaves = original  # type: ignore[method-assign]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # every bias TP lays out leaves packed (a DTensor's layout, split or replicated, is sticky; SGD keeps no
    # state); the weights are matrix operands and stay arrays; the parameters TP leaves alone have no layout
    placed = tp_2x4(hf_gpt2(1, "sdpa").to(DEV))
    laid = [p for p in placed.parameters() if hasattr(p, "placements")]
    biases = sum(p.dim() == 1 for p in laid)
    assert len(laid) > biases >= 4 and seen and max(seen) == biases


def test_matrix_operands_are_found_through_views_not_through_casts() -> None:
    """The leaves a product reads (directly, or through a transpose) are the ones :func:`packs.matrix_operands`
    names; a leaf cast first, or read by an elementwise op, is not one."""
    from xla_dtensor.core.ir import topo_order
    x, w, v, b = (torch.randn(4, 4, device=DEV) for _ in range(4))
    xla_dtensor.sync()
    leaf = {name: value_of(t) for name, t in (("x", x), ("w", w), ("v", v), ("b", b))}
    assert all(n.op == "data" for n in leaf.values())
    out = [torch.mm(x, w.t()), torch.mm(x, v.to(torch.bfloat16).float()), b + 1]
    got = packs.matrix_operands(topo_order([value_of(t) for t in out]))
    assert got == {id(leaf["x"]), id(leaf["w"])}
