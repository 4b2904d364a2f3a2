"""One test per torch_xla name in docs/migrating_from_torch_xla.md, against torch_xla's documented behaviour.

The guide's table is parsed: every name marked ``same`` or ``different`` must have an entry
in ``PROVIDED`` (its behaviour checked against an independent oracle: torch CPU eager values,
hand-derived HLO sharding strings and shard shapes, the values torch_xla documents under SPMD
for one process on 8 devices), and every ``not provided`` name an entry in ``NOT_PROVIDED``
(it raises naming the alternative, or is not exported). A new row without a test fails
``test_every_guide_name_has_a_test``.

torch_xla references: ``torch_xla/runtime.py`` and ``core/xla_model.py`` docstrings,
``test/spmd/test_xla_spmd_python_api_interaction.py`` (the device-count values under SPMD),
``distributed/spmd/xla_sharding.py`` (Mesh, ShardingSpec, ShardingType values),
``experimental/distributed_checkpoint/manager.py``, ``spmd_fully_sharded_data_parallel.py``.
"""
from __future__ import annotations

import collections
import contextlib
import io
import os
import re
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

import xla_dtensor
import xla_dtensor.compat.torch_xla as torch_xla
import xla_dtensor.compat.torch_xla.core.xla_model as xm
import xla_dtensor.compat.torch_xla.distributed.parallel_loader as pl
import xla_dtensor.compat.torch_xla.distributed.spmd as xs
import xla_dtensor.compat.torch_xla.experimental.distributed_checkpoint as xc
import xla_dtensor.compat.torch_xla.runtime as xr
from xla_dtensor.compat.torch_xla.experimental.spmd_fully_sharded_data_parallel import SpmdFullyShardedDataParallel

GUIDE = Path(__file__).resolve().parents[3] / "docs" / "migrating_from_torch_xla.md"


def guide_names() -> dict[str, str]:
    """``{name: "same" | "different" | "not provided"}`` from the guide's table.

    A cell's names are its backticked items up to ``(``; a bare name after a dotted one
    takes that one's prefix (`` `xr.world_size`, `global_ordinal` `` is ``xr.global_ordinal``).
    """
    out: dict[str, str] = {}
    for line in GUIDE.read_text().splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        status = cells[1]
        assert status in ("same", "different", "not provided"), line
        prefix = ""
        for item in re.findall(r"`([^`]+)`", cells[0]):
            name = item.split("(")[0].strip()
            if "." in name:
                prefix = name[:name.rindex(".") + 1]
            else:
                name = prefix + name
            out[name] = status
    return out


@pytest.fixture(scope="module")
def mesh() -> xs.Mesh:
    return xs.Mesh(np.arange(8), (2, 4), ("x", "y"))


@pytest.fixture(scope="module")
def fsdp_mesh() -> xs.Mesh:
    return xs.Mesh(range(8), (8, 1), ("fsdp", "model"))


class Ctx:
    """What a case gets: the ``x, y`` mesh (2 x 4), the lazy device and a temporary folder."""

    def __init__(self, mesh: xs.Mesh, fsdp_mesh: xs.Mesh, dev: torch.device, tmp: Path) -> None:
        self.mesh, self.fsdp_mesh, self.dev, self.tmp = mesh, fsdp_mesh, dev, tmp


PROVIDED: dict[str, Callable[[Ctx], None]] = {}
NOT_PROVIDED: dict[str, Callable[[Ctx], None]] = {}


def provided(*names: str) -> Callable:
    def deco(fn: Callable[[Ctx], None]) -> Callable[[Ctx], None]:
        for n in names:
            assert n not in PROVIDED, n
            PROVIDED[n] = fn
        return fn
    return deco


def _close(a: torch.Tensor, b: torch.Tensor, atol: float = 1e-5) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.detach().cpu(), b.detach(), atol=atol)


# --- torch_xla -----------------------------------------------------------------------------
@provided("torch_xla.device")
def _device(c: Ctx) -> None:
    d = torch_xla.device()
    assert isinstance(d, torch.device) and d.type == "jax"
    assert torch_xla.device(0) == d == xm.xla_device()  # SPMD: one virtual device wraps all chips
    assert torch.ones(2, device=d).device == d


@provided("torch_xla.sync")
def _sync(c: Ctx) -> None:
    x = torch.arange(6.).reshape(2, 3)
    y = x.to(c.dev) * 3 + 1
    before = xla_dtensor.metrics.snapshot()
    assert torch_xla.sync() is None
    ran = xla_dtensor.metrics.diff(before)["executions"]
    assert ran >= 1  # the pending graph ran at the sync, not at the read below
    torch_xla.sync(wait=True)
    before = xla_dtensor.metrics.snapshot()
    assert torch.equal(y.cpu(), x * 3 + 1)
    assert xla_dtensor.metrics.diff(before)["executions"] == 0


# --- torch_xla.runtime / core.xla_model: the values torch_xla documents under SPMD -----------
# One process on 8 chips: test/spmd/test_xla_spmd_python_api_interaction.py (BasicRuntimeAPITest,
# BasicXMAPITest) asserts these values (its *_runtime_* counts are the chips).
RUNTIME_VALUES: dict[str, tuple[Callable[[], Any], Any]] = {
    "xr.is_spmd": (xr.is_spmd, True),
    "xr.world_size": (xr.world_size, 1),
    "xr.global_ordinal": (xr.global_ordinal, 0),
    "xr.local_ordinal": (xr.local_ordinal, 0),
    "xr.process_index": (xr.process_index, 0),
    "xr.process_count": (xr.process_count, 1),
    "xr.host_index": (xr.host_index, 0),
    "xr.local_process_count": (xr.local_process_count, 1),
    "xr.global_runtime_device_count": (xr.global_runtime_device_count, 8),
    "xr.addressable_runtime_device_count": (xr.addressable_runtime_device_count, 8),
    "xr.global_device_count": (xr.global_device_count, 1),
    "xr.addressable_device_count": (xr.addressable_device_count, 1),
    "xr.local_device_count": (xr.local_device_count, 1),
    "xr.device_type": (xr.device_type, "CPU"),
    "xm.xrt_world_size": (xm.xrt_world_size, 1),
    "xm.get_ordinal": (xm.get_ordinal, 0),
    "xm.get_local_ordinal": (xm.get_local_ordinal, 0),
    "xm.is_master_ordinal": (xm.is_master_ordinal, True),
    "xm.get_xla_supported_devices": (xm.get_xla_supported_devices, ["xla:0"]),
}


def _runtime_value(name: str) -> Callable[[Ctx], None]:
    fn, want = RUNTIME_VALUES[name]

    def check(c: Ctx) -> None:
        got = fn()
        assert got == want and type(got) is type(want), (name, got, want)
    return check


for _name in RUNTIME_VALUES:
    provided(_name)(_runtime_value(_name))


@provided("xr.use_spmd")
def _use_spmd(c: Ctx) -> None:
    from xla_dtensor.spmd import auto
    assert xr.use_spmd() is None and xr.is_spmd()
    try:
        xr.use_spmd(auto=True)  # torch_xla: switches the auto-sharder on
        assert auto._GLOBAL and xr.is_spmd()
    finally:
        xr.use_spmd(auto=False)
    assert not auto._GLOBAL


@provided("xr.global_runtime_device_attributes")
def _device_attributes(c: Ctx) -> None:
    attrs = xr.global_runtime_device_attributes()
    assert isinstance(attrs, list) and all(isinstance(a, dict) for a in attrs)
    assert [a["id"] for a in attrs] == list(range(8))
    assert [a["name"] for a in attrs] == [f"CPU:{i}" for i in range(8)]
    assert {a["process_index"] for a in attrs} == {0}


@provided("xr.initialize_cache")
def _initialize_cache(c: Ctx) -> None:
    from jax._src import compilation_cache

    from xla_dtensor import runtime
    keys = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")
    saved = {k: getattr(jax.config, k) for k in keys}
    state = dict(runtime._STATE)
    folder = c.tmp / "cache"
    try:
        assert xr.initialize_cache(str(folder)) is True and runtime.cache_path() == str(folder)
        with pytest.warns(runtime.CacheWarning, match="not a readable directory"):
            assert xr.initialize_cache(str(c.tmp / "missing"), readonly=True) is False
        assert runtime.cache_path() == str(folder)  # an unusable folder leaves the cache as it was
        xr.initialize_cache(str(folder))
        jax.jit(lambda a: a * 7 + 3)(np.arange(3.0, dtype=np.float32)).block_until_ready()
        entries = [f for f in os.listdir(folder) if f.endswith("-cache")]
        assert entries  # the program was written ...
        for f in entries:  # ... with its fingerprint
            payload, why = runtime.open_entry(f[:-len("-cache")], (folder / f).read_bytes())
            assert payload is not None, why
    finally:
        for k, v in saved.items():
            jax.config.update(k, v)
        runtime._STATE.clear()
        runtime._STATE.update(state)
        compilation_cache.reset_cache()


@provided("xm.xla_device")
def _xla_device(c: Ctx) -> None:
    d = torch_xla.device()
    assert xm.xla_device() == d and all(xm.xla_device(n) == d for n in range(8))
    assert xm.xla_device(devkind="CPU") == d
    with pytest.raises(ValueError, match="devices 0..7"):  # the documented difference: n is checked
        xm.xla_device(8)


@provided("xm.mark_step")
def _mark_step(c: Ctx) -> None:
    x = torch.linspace(-1, 1, 5)
    y = torch.exp(x.to(c.dev)) - 1
    before = xla_dtensor.metrics.snapshot()
    xm.mark_step()
    xm.mark_step(wait=True, reset_scope=True)
    assert xla_dtensor.metrics.diff(before)["executions"] >= 1
    assert _close(y, torch.exp(x) - 1)


@provided("xm.wait_device_ops")
def _wait_device_ops(c: Ctx) -> None:
    y = torch.full((4,), 2.0, device=c.dev) ** 3
    xm.mark_step()
    assert xm.wait_device_ops() is None and xm.wait_device_ops(devices=[]) is None
    assert y.tolist() == [8.0] * 4


@provided("xm.xla_device_hw")
def _xla_device_hw(c: Ctx) -> None:
    assert xm.xla_device_hw(xm.xla_device()) == "CPU" == xr.device_type()


@provided("xm.master_print")
def _master_print(c: Ctx) -> None:
    buf = io.StringIO()
    xm.master_print("loss", 1.5, fd=buf)
    xm.master_print("local", local=True, flush=True, fd=buf)
    assert buf.getvalue() == "loss 1.5\nlocal\n"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        xm.master_print("to stdout")
    assert out.getvalue() == "to stdout\n"


@provided("xm.optimizer_step")
def _optimizer_step(c: Ctx) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Linear(3, 2)
    lin = torch.nn.Linear(3, 2)
    lin.load_state_dict(ref.state_dict())
    lin.to(c.dev)
    x = torch.randn(4, 3)
    opt, ref_opt = torch.optim.SGD(lin.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    lin(x.to(c.dev)).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert xm.optimizer_step(opt, barrier=True) is None
    ref_opt.step()
    assert _close(lin.weight, ref.weight) and _close(lin.bias, ref.bias)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = lin(x.to(c.dev)).sum()
        loss.backward()
        return loss
    loss = xm.optimizer_step(opt, optimizer_args={"closure": closure})
    ref_opt.zero_grad()
    ref_loss = ref(x).sum()
    ref_loss.backward()
    ref_opt.step()
    assert _close(loss, ref_loss) and _close(lin.weight, ref.weight)


# --- distributed.spmd: meshes ----------------------------------------------------------------
@provided("xs.Mesh")
def _mesh(c: Ctx) -> None:
    ids = [3, 1, 0, 2, 7, 5, 4, 6]
    m = xs.Mesh(ids, (2, 4), ("a", "b"))
    assert m.get_logical_mesh().tolist() == np.array(ids).reshape(2, 4).tolist()
    assert m.size() == 8 and m.shape() == collections.OrderedDict([("a", 2), ("b", 4)])
    assert m.get_axis_name_idx("b") == 1 and m.get_axis_name_idx("c") is None
    for bad in [lambda: xs.Mesh(range(8), (3, 3)), lambda: xs.Mesh([0, 0, 1, 2], (4,)),
                lambda: xs.Mesh(range(8), (8,), ("a", "b"))]:
        with pytest.raises(AssertionError):
            bad()


@provided("Mesh.get_op_sharding")
def _get_op_sharding(c: Ctx) -> None:
    # devices are numbered x * 4 + y: a dim split over y alone lists them y-major: 0 4 1 5 2 6 3 7
    want = {("x", "y"): "{devices=[2,4]<=[8]}",
            (None, "y"): "{devices=[1,4,2]<=[2,4]T(1,0) last_tile_dim_replicate}",
            ("x", None): "{devices=[2,1,4]<=[8] last_tile_dim_replicate}",
            (("x", "y"), None): "{devices=[8,1]<=[8]}",
            (None, None): "{replicated}"}
    for spec, hlo in want.items():
        got = c.mesh.get_op_sharding(spec)
        assert isinstance(got, xla_dtensor.HloSharding) and str(got) == hlo, (spec, str(got))


@provided("xs.HybridMesh")
def _hybrid_mesh(c: Ctx) -> None:
    hm = xs.HybridMesh(ici_mesh_shape=(2, 4), axis_names=("data", "model"))
    assert hm.dcn_mesh_shape == (1, 1) and hm.mesh_shape == (2, 4)
    assert hm.get_logical_mesh().tolist() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    two = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    assert two.mesh_shape == (2, 4)  # ici * dcn, elementwise
    assert sorted(two.get_logical_mesh().ravel().tolist()) == list(range(8))
    assert two.shape() == collections.OrderedDict([("dcn", 2), ("ici", 4)])


@provided("xs.get_1d_mesh")
def _get_1d_mesh(c: Ctx) -> None:
    m = xs.get_1d_mesh("data")
    assert isinstance(m, xs.Mesh) and m.mesh_shape == (8,) and tuple(m.axis_names) == ("data",)
    assert m.get_logical_mesh().tolist() == list(range(8))


@provided("xs.set_global_mesh", "xs.get_global_mesh")
def _global_mesh(c: Ctx) -> None:
    old = xs.get_global_mesh()
    try:
        assert xs.set_global_mesh(c.mesh) is None
        assert xs.get_global_mesh() is c.mesh
        other = xs.get_1d_mesh("z")
        xs.set_global_mesh(other)
        assert xs.get_global_mesh() is other
    finally:
        xs.set_global_mesh(old)
    assert xs.get_global_mesh() is old


# --- distributed.spmd: annotations -----------------------------------------------------------
@provided("xs.mark_sharding")
def _mark_sharding(c: Ctx) -> None:
    cpu = torch.arange(32.).reshape(8, 4)
    t = cpu.to(c.dev)
    st = xs.mark_sharding(t, c.mesh, ("x", "y"))
    assert isinstance(st, xs.XLAShardedTensor) and st.global_tensor is t
    assert st.sharding_spec == "{devices=[2,4]<=[8]}"
    for s in st.local_shards:  # device d holds rows of x = d // 4, column y = d % 4
        d = int(s.shard_device.split(":")[1])
        assert torch.equal(s.data, cpu[4 * (d // 4):4 * (d // 4) + 4, d % 4:d % 4 + 1])
    assert torch.equal(t.cpu(), cpu)
    u = torch.zeros(8, 4).to(c.dev)  # mesh axes by index, as torch_xla allows: dim 0 over y, dim 1 over x
    assert xs.mark_sharding(u, c.mesh, (1, 0)).sharding_spec == "{devices=[4,2]<=[2,4]T(1,0)}"
    with pytest.raises(RuntimeError):  # torch_xla refuses to re-annotate with another layout
        xs.mark_sharding(u, c.mesh, (0, 1))
    with pytest.raises(AssertionError):
        xs.mark_sharding(u, c.mesh, ("x",))


@provided("xs.clear_sharding")
def _clear_sharding(c: Ctx) -> None:
    t = torch.arange(8.).reshape(2, 4).to(c.dev)
    st = xs.mark_sharding(t, c.mesh, ("x", "y"))
    out = xs.clear_sharding(st)
    assert out is t and xs.get_sharding_spec(t) == ""
    assert torch.equal(t.cpu(), torch.arange(8.).reshape(2, 4))
    assert xs.mark_sharding(t, c.mesh, (None, "y")).sharding_spec.startswith("{devices=[1,4,2]")  # no longer refused


@provided("torch_xla._XLAC._get_xla_sharding_spec")
def _get_sharding_spec(c: Ctx) -> None:
    t = torch.ones(8, 2).to(c.dev)
    assert xs.get_sharding_spec(t) == "" and xs.get_sharding_spec(torch.ones(2)) == ""
    xs.mark_sharding(t, c.mesh, (("x", "y"), None))
    assert xs.get_sharding_spec(t) == "{devices=[8,1]<=[8]}"
    assert xs.get_sharding_spec(xs.wrap_as_sharded_tensor(t)) == "{devices=[8,1]<=[8]}"


@provided("xs.ShardingSpec")
def _sharding_spec(c: Ctx) -> None:
    spec = xs.ShardingSpec(c.mesh, ("x", None))
    assert spec.minibatch is False
    assert spec.can_apply(torch.zeros(4, 4)) and not spec.can_apply(torch.zeros(4))
    t = torch.zeros(4, 4).to(c.dev)
    assert spec.apply(t) is None
    assert xs.get_sharding_spec(t) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"


@provided("xs.ShardingType")
def _sharding_type(c: Ctx) -> None:
    assert {k: int(v) for k, v in xs.ShardingType.__members__.items()} == {
        "REPLICATED": 0, "MAXIMAL": 1, "TUPLE": 2, "TILED": 3, "MANUAL": 4, "PARTIAL": 5, "UNKNOWN": 6}
    want = {("x", "y"): xs.ShardingType.TILED, ("x", None): xs.ShardingType.PARTIAL,
            (None, None): xs.ShardingType.REPLICATED}
    for spec, kind in want.items():
        assert xs.mark_sharding(torch.zeros(2, 4).to(c.dev), c.mesh, spec).sharding_type == kind, spec


@provided("xs.XLAShardedTensor")
def _sharded_tensor(c: Ctx) -> None:
    cpu = torch.arange(10.)
    g = cpu.to(c.dev).requires_grad_()
    xs.mark_sharding(g, c.mesh, ("y",))
    st = xs.XLAShardedTensor(g)
    assert st.global_tensor is g and st.global_tensor.requires_grad
    assert st.sharding_spec == "{devices=[4,2]<=[2,4]T(1,0) last_tile_dim_replicate}"
    shards = st.local_shards
    assert len(shards) == 8 and {tuple(s.data.shape) for s in shards} == {(3,)}  # 10 over 4: padded to 3
    for s in shards:  # device d holds piece y = d % 4 of torch.chunk(cpu, 4)
        d = int(s.shard_device.split(":")[1])
        assert torch.equal(s.unpadded_data, torch.chunk(cpu, 4)[d % 4])
    assert tuple(st.shape) == (10,) and torch.equal(st.global_tensor.detach().cpu(), cpu)


@provided("xs.XLAShard")
def _xla_shard(c: Ctx) -> None:
    s = xs.XLAShard(torch.arange(6.).reshape(2, 3), (slice(4, 5), slice(0, 3)), "xla:3", 0)
    assert torch.equal(s.unpadded_data, torch.arange(3.).reshape(1, 3))
    assert (s.shard_device, s.replica_id) == ("xla:3", 0)
    t = torch.arange(7.).to(c.dev)
    last = xs.mark_sharding(t, c.mesh, (("x", "y"),)).local_shards[-1]
    assert isinstance(last, xs.XLAShard) and last.indices == (slice(7, 7),) and last.shard_device == "xla:7"
    assert tuple(last.data.shape) == (1,) and last.unpadded_data.numel() == 0


@provided("xs.wrap_as_sharded_tensor")
def _wrap_as(c: Ctx) -> None:
    t = torch.arange(4.).to(c.dev)
    w = xs.wrap_as_sharded_tensor(t)
    assert isinstance(w, xs.XLAShardedTensor) and w.global_tensor is t
    assert xs.wrap_as_sharded_tensor(w) is w
    assert torch.equal(w.global_tensor.cpu(), torch.arange(4.))


@provided("xs.unwrap_sharded_tensor")
def _unwrap(c: Ctx) -> None:
    t = torch.arange(8.).to(c.dev)
    st = xs.mark_sharding(t, c.mesh, (("x", "y"),))
    assert xs.unwrap_sharded_tensor(st) is t and xs.unwrap_sharded_tensor(t) is t
    cpu = torch.ones(2)
    assert xs.unwrap_sharded_tensor(cpu) is cpu


@provided("xs.wrap_if_sharded")
def _wrap_if(c: Ctx) -> None:
    t = torch.arange(8.).to(c.dev)
    xs.mark_sharding(t, c.mesh, ("y",))
    w = xs.wrap_if_sharded(t)
    assert isinstance(w, xs.XLAShardedTensor) and w.global_tensor is t and w.sharding_spec == xs.get_sharding_spec(t)
    plain = torch.ones(3).to(c.dev)
    assert xs.wrap_if_sharded(plain) is plain and xs.wrap_if_sharded(3) == 3


@provided("xs.mark_sharding_with_gradients")
def _mark_with_gradients(c: Ctx) -> None:
    x = torch.randn(8, 4)
    xd = x.to(c.dev).requires_grad_()
    y = xs.mark_sharding_with_gradients(xd, c.mesh, ("x", None))
    assert _close(y, x)
    (y * y).sum().backward()
    assert _close(xd.grad, 2 * x)
    assert xs.get_sharding_spec(y) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"


@provided("xs.xla_distribute_tensor")
def _distribute_tensor(c: Ctx) -> None:
    cpu = torch.arange(30.).reshape(10, 3)
    d = xs.xla_distribute_tensor(cpu, c.mesh, [Replicate(), Shard(0)])
    assert tuple(d.shape) == (10, 3) and d.placements == (Replicate(), Shard(0))
    shards = d.local_shards
    assert [tuple(s.data.shape) for s in shards] == [(3, 3), (3, 3), (3, 3), (1, 3)] * 2  # torch.chunk sizes
    for s in shards:
        assert torch.equal(s.data, cpu[s.indices])
    assert torch.equal(d.cpu(), cpu)


@provided("xs.xla_distribute_module")
def _distribute_module(c: Ctx) -> None:
    torch.manual_seed(0)
    ref = torch.nn.Linear(4, 8)
    lin = torch.nn.Linear(4, 8)
    lin.load_state_dict(ref.state_dict())

    def partition(name: str, mod: torch.nn.Module, mesh: Any) -> None:
        if isinstance(mod, torch.nn.Linear):
            mod.register_parameter("weight", torch.nn.Parameter(xs.xla_distribute_tensor(mod.weight, mesh, [
                Replicate(), Shard(0)])))
    out_mod = xs.xla_distribute_module(lin, c.mesh, partition)
    assert out_mod is lin and lin.weight.placements == (Replicate(), Shard(0))
    x = torch.randn(2, 4)
    assert _close(lin(x.to(c.dev)), ref(x))


@provided("xs.dynamo_mark_sharding")
def _dynamo_mark_sharding(c: Ctx) -> None:
    a = xs.dynamo_mark_sharding(torch.zeros(8, 2).to(c.dev), list(range(8)), [2, 4], "('x', 'y')", "('y', 'x')")
    assert a.sharding_spec == "{devices=[4,2]<=[2,4]T(1,0)}"
    b = xs.dynamo_mark_sharding(torch.zeros(8).to(c.dev), list(range(8)), [8], ("d",), ("d",))
    assert b.sharding_spec == "{devices=[8]<=[8]}"


@provided("xs.shard_as")
def _shard_as(c: Ctx) -> None:
    a, b = torch.arange(64.).reshape(8, 8).to(c.dev), torch.ones(8, 8).to(c.dev)
    xs.mark_sharding(a, c.mesh, ("y", "x"))
    a2, b2 = xs.shard_as(a, b)
    assert xs.get_sharding_spec(b2) == xs.get_sharding_spec(a2) == "{devices=[4,2]<=[2,4]T(1,0)}"
    assert torch.equal(b2.cpu(), torch.ones(8, 8)) and torch.equal(a2.cpu(), torch.arange(64.).reshape(8, 8))
    p, q = torch.zeros(8, 8).to(c.dev), torch.zeros(8, 8).to(c.dev)  # the documented difference:
    xs.mark_sharding(q, c.mesh, (("x", "y"), None))                  # an unsplit first takes the second's
    p2, _ = xs.shard_as(p, q)
    assert xs.get_sharding_spec(p2) == "{devices=[8,1]<=[8]}"
    with pytest.raises(ValueError):
        xs.shard_as(torch.zeros(2).to(c.dev), torch.zeros(3).to(c.dev))


@provided("xs.apply_backward_optimization_barrier")
def _backward_barrier(c: Ctx) -> None:
    torch.manual_seed(1)
    ref = torch.nn.Linear(4, 4)
    lin = torch.nn.Linear(4, 4)
    lin.load_state_dict(ref.state_dict())
    lin.to(c.dev)
    assert xs.apply_backward_optimization_barrier(lin) is None
    x = torch.randn(2, 4)
    lin(x.to(c.dev)).pow(2).sum().backward()
    ref(x).pow(2).sum().backward()
    assert "opt-barrier" in xla_dtensor.get_hlo([lin.weight.grad])
    assert _close(lin.weight.grad, ref.weight.grad) and _close(lin.bias.grad, ref.bias.grad)


# --- distributed.parallel_loader ---------------------------------------------------------------
@provided("MpDeviceLoader")
def _mp_device_loader(c: Ctx) -> None:
    data = [torch.arange(32.).reshape(16, 2) + 100 * i for i in range(3)]
    spec = xs.ShardingSpec(c.mesh, (("x", "y"), None))
    loader = pl.MpDeviceLoader(data, c.dev, input_sharding=spec, loader_prefetch_size=1, device_prefetch_size=1)
    assert len(loader) == 3
    out = list(loader)
    assert len(out) == 3 and all(o.device == c.dev and torch.equal(o.cpu(), d) for o, d in zip(out, data))
    assert {xs.get_sharding_spec(o) for o in out} == {"{devices=[8,1]<=[8]}"}
    assert [tuple(s.data.shape) for s in xs.wrap_as_sharded_tensor(out[0]).local_shards] == [(2, 2)] * 8
    assert torch.equal(next(iter(pl.MpDeviceLoader(data[:1], c.dev))).cpu(), data[0])  # no sharding: replicated


@provided("ParallelLoader")
def _parallel_loader(c: Ctx) -> None:
    data = [{"x": torch.full((8, 2), float(i)), "step": i} for i in range(2)]
    spec = xs.ShardingSpec(c.mesh, ("x", None))
    per = pl.ParallelLoader(data, [c.dev], input_sharding={"x": spec}).per_device_loader(c.dev)
    got = list(per)
    assert [b["step"] for b in got] == [0, 1]
    assert all(torch.equal(b["x"].cpu(), d["x"]) for b, d in zip(got, data))
    assert xs.get_sharding_spec(got[0]["x"]) == "{devices=[2,1,4]<=[8] last_tile_dim_replicate}"


# --- experimental.distributed_checkpoint -------------------------------------------------------
@provided("SPMDSavePlanner")
def _save_planner(c: Ctx) -> None:
    import torch.distributed.checkpoint as dcp
    cpu = torch.arange(16.).reshape(8, 2)
    w = cpu.to(c.dev)
    xs.mark_sharding(w, c.mesh, ("x", None))
    path = str(c.tmp / "save_planner")
    dcp.save({"w": w}, storage_writer=dcp.FileSystemWriter(path), planner=xc.SPMDSavePlanner(), no_dist=True)
    out = {"w": torch.zeros(8, 2)}  # read back with torch's own default planner (the oracle)
    dcp.load(out, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    assert torch.equal(out["w"], cpu)


@provided("SPMDLoadPlanner")
def _load_planner(c: Ctx) -> None:
    import torch.distributed.checkpoint as dcp
    cpu = torch.arange(16.).reshape(8, 2) * 3
    path = str(c.tmp / "load_planner")
    dcp.save({"w": cpu}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)  # written by torch itself
    target = torch.zeros(8, 2).to(c.dev)
    xs.mark_sharding(target, c.mesh, (("x", "y"), None))
    dcp.load({"w": target}, storage_reader=dcp.FileSystemReader(path), planner=xc.SPMDLoadPlanner(), no_dist=True)
    assert torch.equal(target.cpu(), cpu)
    assert xs.get_sharding_spec(target) == "{devices=[8,1]<=[8]}"  # loaded in place, in its layout


@provided("CheckpointManager")
def _checkpoint_manager(c: Ctx) -> None:
    w = torch.arange(16.).reshape(8, 2).to(c.dev)
    xs.mark_sharding(w, c.mesh, ("x", None))
    mgr = xc.CheckpointManager(str(c.tmp / "ckpt"), 2, max_to_keep=2, max_pending_async=1)
    assert mgr.should_save(4) and not mgr.should_save(3)
    assert mgr.save(1, {"w": w}) is False and mgr.all_steps() == []
    assert mgr.save(2, {"w": w}) is True
    for step in (4, 6):
        assert mgr.save_async(step, {"w": w * step}) is True
    mgr.join()
    assert mgr.all_steps() == [4, 6]  # max_to_keep dropped the oldest
    target = torch.zeros(8, 2).to(c.dev)
    mgr.restore(4, {"w": target})
    assert torch.equal(target.cpu(), torch.arange(16.).reshape(8, 2) * 4)
    with pytest.raises(AssertionError, match="saved steps"):  # torch_xla asserts the step is tracked
        mgr.restore(2, {"w": target})
    assert mgr.restore_latest({"w": target}) == 6
    assert torch.equal(target.cpu(), torch.arange(16.).reshape(8, 2) * 6)
    assert xc.CheckpointManager(str(c.tmp / "ckpt"), 5).all_steps() == [4, 6]  # a new manager finds them


@provided("prime_optimizer")
def _prime_optimizer(c: Ctx) -> None:
    torch.manual_seed(2)
    lin = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in lin.state_dict().items()}
    lin.to(c.dev)
    opt = torch.optim.AdamW(lin.parameters(), lr=0.1, weight_decay=0.5)
    assert not opt.state
    assert xc.prime_optimizer(opt) is opt
    assert set(opt.state) == set(lin.parameters())  # the state exists, so a checkpoint can load into it
    for p in lin.parameters():
        assert torch.equal(opt.state[p]["exp_avg"].cpu(), torch.zeros(p.shape))
    assert all(torch.equal(v.cpu(), before[k]) for k, v in lin.state_dict().items())  # weights untouched
    assert [g["lr"] for g in opt.param_groups] == [0.1]


# --- experimental.spmd_fully_sharded_data_parallel ---------------------------------------------
@provided("SpmdFullyShardedDataParallel")
def _fsdpv2(c: Ctx) -> None:
    torch.manual_seed(3)
    ref = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    model.load_state_dict(ref.state_dict())
    m = SpmdFullyShardedDataParallel(model, mesh=c.fsdp_mesh)
    assert m.module is model and m[0] is model[0] and m.state_dict is not None
    spec = {n: xs.get_sharding_spec(p) for n, p in model.named_parameters()}
    assert spec == {"0.weight": "{devices=[1,8]<=[8]}",  # (8, 12): the largest dim, uneven (12 over 8)
                    "0.bias": "{devices=[8]<=[8]}",
                    "2.weight": "{devices=[1,8]<=[8]}",  # (4, 8)
                    "2.bias": "{devices=[8]<=[8]}"}      # (4,): uneven
    x = torch.randn(16, 12)
    out = m(x.to(c.dev))
    assert xs.get_sharding_spec(out) == "{devices=[8,1]<=[8]}"  # batch dim over "fsdp"
    assert _close(out, ref(x))
    out.sum().backward()
    ref(x).sum().backward()
    assert _close(model[0].weight.grad, ref[0].weight.grad) and _close(model[2].bias.grad, ref[2].bias.grad)
    pre = torch.nn.Linear(12, 8).to(c.dev)  # a parameter the user annotated keeps its layout
    xs.mark_sharding(pre.weight, c.fsdp_mesh, ("fsdp", None))
    SpmdFullyShardedDataParallel(pre, mesh=c.fsdp_mesh)
    assert xs.get_sharding_spec(pre.weight) == "{devices=[8,1]<=[8]}"
    with pytest.raises(ValueError, match="'fsdp'"):
        SpmdFullyShardedDataParallel(torch.nn.Linear(2, 2), mesh=c.mesh)


# --- torch.compile ---------------------------------------------------------------------------
@provided("torch.compile")
def _compile(c: Ctx) -> None:
    import xla_dtensor.dynamo_backend  # noqa: F401  (registers backend="xla_dtensor" in a source checkout)
    x = torch.linspace(-2, 2, 6)
    f = torch.compile(lambda t: torch.sin(t) * 2 + t, backend="xla_dtensor")
    out = f(x.to(c.dev))
    assert out.device == c.dev and _close(out, torch.sin(x) * 2 + x)


# --- not provided: they raise naming the alternative, or are not exported -----------------------
def _raises_manual(fn: Callable[[Ctx], Any]) -> Callable[[Ctx], None]:
    def check(c: Ctx) -> None:
        with pytest.raises(NotImplementedError, match="shard_map") as err:
            fn(c)
        assert isinstance(err.value, xs.ManualShardingError) and "constrain_activation" in str(err.value)
    return check


NOT_PROVIDED.update({
    "xs.enable_manual_sharding": _raises_manual(lambda c: xs.enable_manual_sharding(
        torch.zeros(8, 2).to(c.dev), ("x", None), mesh=c.mesh)),
    "xs.disable_manual_sharding": _raises_manual(lambda c: xs.disable_manual_sharding(
        torch.zeros(4, 2).to(c.dev), ("x", None), (8, 2), mesh=c.mesh)),
    "xs._mark_manual_sharding": _raises_manual(lambda c: xs._mark_manual_sharding(torch.zeros(2).to(c.dev))),
})


def _absent(attr: str) -> Callable[[Ctx], None]:
    def check(c: Ctx) -> None:
        assert not hasattr(xs, attr)  # the guide's alternative: plain nn.Linear
    return check


NOT_PROVIDED.update({f"xs.{a}": _absent(a) for a in ("XLAPatchedLinear", "xla_patched_nn_linear_forward")})


# --- the tests ---------------------------------------------------------------------------------
def test_every_guide_name_has_a_test() -> None:
    names = guide_names()
    assert len(names) > 60
    assert {n for n, s in names.items() if s != "not provided"} == set(PROVIDED)
    assert {n for n, s in names.items() if s == "not provided"} == set(NOT_PROVIDED)


@pytest.fixture
def ctx(mesh: xs.Mesh, fsdp_mesh: xs.Mesh, dev: torch.device, tmp_path: Path) -> Ctx:
    return Ctx(mesh, fsdp_mesh, dev, tmp_path)


@pytest.mark.parametrize("name", sorted(PROVIDED))
def test_provided(name: str, ctx: Ctx) -> None:
    PROVIDED[name](ctx)


@pytest.mark.parametrize("name", sorted(NOT_PROVIDED))
def test_not_provided(name: str, ctx: Ctx) -> None:
    NOT_PROVIDED[name](ctx)
