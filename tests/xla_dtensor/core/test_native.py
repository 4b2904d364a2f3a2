"""The recorder's hot path in C (``xla_dtensor/core/_native.c``) against its Python reference.

Oracles: the Python functions the C replaces (``ir.PYTHON``, ``signature.PYTHON``,
``tensor.PYTHON``), called on the same inputs; and, end to end, the same training run in a
fresh process with ``XLA_DTENSOR_NATIVE=0`` (the Python path) and without it: the losses match
torch CPU and each other, and the counters of recorded ops, hash-cons hits, compiles and
reused plans are equal, on one device, DP, 2x4 Megatron, FSDP, AUTO and transformers' GPT-2.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch

import xla_dtensor
from xla_dtensor import metrics
from xla_dtensor.core import ir, native, signature as S, tensor as T, threads
from xla_dtensor.core.state import STATE
from tests import _parallel
from tests._parallel import Results

ROOT = Path(__file__).resolve().parents[3]
needs_native = pytest.mark.skipif(not native.ON, reason=f"the C recorder is not in use: {native.REASON}")


def test_the_dev_install_builds_the_c_recorder():
    """CI and ``dev.py`` install with the extension: the Python path there would be a silent fallback."""
    if os.environ.get("XLA_DTENSOR_NATIVE") == "0":
        pytest.skip("XLA_DTENSOR_NATIVE=0 chooses the Python path")
    assert native.ON, native.REASON
    assert type(ir.Node(ir.DATA, 1, (), 1, None)).__module__ == "xla_dtensor.core._native"


# ---------------------------------------------------------------- nodes, hash-consing, the tape

@needs_native
def test_node_has_the_reference_fields_and_behaviour():
    leaf = ir.Node(ir.DATA, ("k",), (), -5, None, "arr")
    op = ir.Node("add", ("add",), (leaf, leaf), 77, len)
    assert (leaf.op, leaf.key, leaf.inputs, leaf.hash, leaf.fn, leaf.data, leaf.sharding, leaf.tix) == \
        (ir.DATA, ("k",), (), -5, None, "arr", None, -1)
    assert leaf.is_leaf and not op.is_leaf and op.seq > leaf.seq
    assert repr(leaf) == "Node(data, leaf, hash=fffffffb)" and repr(op) == "Node(add, 2 inputs, hash=0000004d)"
    op.sharding, op.tix, op.data = "s", 12, 3
    assert (op.sharding, op.tix, op.data) == ("s", 12, 3)
    with pytest.raises(AttributeError):
        op.key = 1
    with pytest.raises(TypeError, match="inputs must be a tuple"):
        ir.Node("x", 1, [leaf], 1, None)
    with pytest.raises(TypeError, match="5 or 6 arguments"):
        ir.Node("x", 1)
    ref = weakref.ref(op)
    del op
    gc.collect()
    assert ref() is None


@needs_native
def test_a_node_cycle_is_collected_and_a_long_chain_frees_without_recursing():
    a = ir.Node("a", 1, (), 1, None)
    a.data = [a]  # a cycle through the data field
    ref = weakref.ref(a)
    del a
    gc.collect()
    assert ref() is None
    x = ir.Node(ir.DATA, 1, (), 1, None)
    for _ in range(300_000):  # deeper than the C stack if freed recursively
        x = ir.Node("neg", 1, (x,), 1, abs)
    del x


def _fields(n) -> tuple:
    return (n.op, n.key, n.hash, n.fn, n.data, len(n.inputs))


@needs_native
@pytest.mark.parametrize("consing", [True, False], ids=["lazy", "eager"])
def test_make_node_and_getitems_match_python(consing, monkeypatch):
    monkeypatch.setattr(STATE, "consing", consing)
    leaf = ir.data_leaf(object(), (2,), torch.float32)
    made = {}
    for impl in ("native", "python"):
        make = ir.make_node if impl == "native" else ir.PYTHON["make_node"]
        items = ir.getitems if impl == "native" else ir.PYTHON["getitems"]
        before = dict(metrics.counters())
        ir.clear_cons()
        a = make("op", ("op", 1), hash(("op", 1)), (leaf, leaf), len)
        b = make("op", ("op", 1), hash(("op", 1)), (leaf, leaf), len)  # the same: one node while consing
        c = make("op", ("op", 2), hash(("op", 1)), (leaf, leaf), len)  # equal hash, another key: a new node
        g = items(a, [2, 0])
        g2 = items(a, range(3))
        tape, base = ir.recorded()
        after = metrics.counters()
        made[impl] = ([_fields(n) for n in (a, b, c, *g, *g2)], a is b, g[1] is g2[0], g[0] is g2[2],
                      [n.tix - base for n in tape], [_fields(n) for n in tape],
                      {k: after[k] - before[k] for k in ("ops_recorded", "hash_cons_hits")})
    assert made["native"] == made["python"]
    assert made["native"][1] is consing


@needs_native
def test_param_leaf_matches_python():
    ir.clear_cons()
    for v in (3, 2.5, 1j, -(2 ** 70)):
        c, p = ir.param_leaf(v), ir.PYTHON["param_leaf"](v)
        assert _fields(c) == _fields(p) and c.data is v
    tape, base = ir.recorded()
    assert [n.tix - base for n in tape] == list(range(8))
    with pytest.raises(TypeError, match="int, float or complex, got str"):
        ir.param_leaf("3")


# ---------------------------------------------------------------- signatures

def _dyn_fields(dyn: list) -> list:
    return [(n.op, n.key, n.hash, n.data if n.op == ir.PARAM else id(n)) for n in dyn]


@needs_native
def test_signature_matches_python_on_every_kind_of_argument():
    dev = xla_dtensor.device()
    x = torch.ones(4, 3, device=dev)
    view = x.t()[1]
    roots = [torch.full((2,), float(i), device=dev) for i in range(10)]
    info = S.op_info(torch.ops.aten.add.Tensor)
    cases = [
        ((x, x), {}),
        ((x, 2.5), {"alpha": 3}),
        ((x, 0), {"alpha": 1.0}),
        ((x, 1), {"alpha": 2 ** 80}),
        ((view, 1j), {}),
        ((x, True, None, "s", torch.float16, torch.device("cpu")), {}),
        ((roots, [x, 2.0, [view, 0.5]]), {"out": None}),
        ((x, torch.tensor(2.0)), {}),  # a 0-d CPU tensor: a transfer leaf
    ]
    for args, kwargs in cases:
        for scalars in (True, False):
            dc, dp = [], []
            ir.clear_cons()
            kc = S.signature(args, kwargs, info, scalars, dc)
            kp = S.PYTHON["signature"](args, kwargs, info, scalars, dp)
            assert kc == kp, (args, kwargs, scalars)
            if any(isinstance(a, torch.Tensor) and a.device.type == "cpu" for a in args):
                assert [n.op for n in dc] == [n.op for n in dp]
            else:
                assert _dyn_fields(dc) == _dyn_fields(dp)
    with pytest.raises(S.MixedDeviceError, match="jax:0 and cpu"):
        S.signature((x, torch.ones(3)), {}, info, True, [])


# ---------------------------------------------------------------- storages, output tensors, dispatch

@needs_native
def test_storage_and_output_tensors_match_python():
    dev = xla_dtensor.device()
    base = torch.arange(6.0, device=dev).reshape(2, 3)
    leaf = T.value_of(base)
    meta = ((2, 3), torch.float32, (3, 1))
    with threads.held():
        c, p = T.new_tensor(meta, leaf), T.PYTHON["new_tensor"](meta, leaf)
        vc = T.new_view(meta, T.storage_of(base), ("step",), leaf)
        vp = T.PYTHON["new_view"](meta, T.storage_of(base), ("step",), leaf)
    for t in (c, p):
        s = T.storage_of(t)
        assert type(t) is T.LazyTensor and t.shape == (2, 3) and t.stride() == (3, 1) and t.device == dev
        assert (s.value, s.meta, s.version, s.donor, s.layout, s.owner) == (leaf, meta, 0, None, None, threads.me())
        assert s in T.live() and T.chain_of(t) == ()
    start = next(T._SEQ)  # compile's capture tells storages made during a trace by this counter
    with threads.held():
        later = T.new_tensor(meta, leaf)
    assert T.storage_of(later).seq > start > T.storage_of(c).seq > T.storage_of(base).seq
    for v in (vc, vp):
        assert T.storage_of(v) is T.storage_of(base) and T.chain_of(v) == ("step",) and v._seen == 0
    s = T.storage_of(c)
    s.version += 1
    s.owner, s.donor = 5, 7
    assert (s.version, s.owner, s.donor) == (1, 5, 7)
    ref = weakref.ref(s)
    refs = len(T.LIVE.data)
    del c, s
    gc.collect()
    assert ref() is None
    assert len(T.LIVE.data) == refs - 1  # its weak reference left the live set as it died
    ps = weakref.ref(T.storage_of(p))
    del p, t  # (the loop above left t = p)
    assert ps() is None and len(T.LIVE.data) == refs - 2  # the Python path's too, without a collection


@needs_native
@pytest.mark.parametrize("owner", [0, 7])
def test_write_matches_python_on_a_root_tensor_and_a_view(owner):
    """The C write rebinds a root tensor's storage as the Python one does (the donor: the old leaf's id); a
    view's write (a scatter into its storage's value) is the Python one's."""
    dev = xla_dtensor.device()
    got = []
    for write in (T.write, T.PYTHON["write"]):
        base = torch.arange(6.0).reshape(2, 3).to(dev)  # a root tensor, its value a device-data leaf
        s, old = T.storage_of(base), T.value_of(base)
        new = T.value_of(base * 2)
        with threads.held():
            write(base, new, owner)
        row = base[1]
        with threads.held():
            write(row, T.value_of(row + 1), owner)  # a view: the storage's value becomes a scatter
        got.append(((s.value.op, s.value.inputs[0] is new), s.version, s.donor == id(old), s.owner, base.cpu()))
    (c_op, c_ver, c_donor, c_owner, c_val), (p_op, p_ver, p_donor, p_owner, p_val) = got
    assert (c_op, c_ver, c_donor, c_owner) == (p_op, p_ver, p_donor, p_owner)
    assert c_ver == 2 and c_donor and c_owner == (owner or threads.me())
    torch.testing.assert_close(c_val, torch.tensor([[0.0, 2, 4], [7, 9, 11]]))
    torch.testing.assert_close(c_val, p_val, rtol=0, atol=0)


@needs_native
@pytest.mark.parametrize("shared", [False, True])
def test_a_syncs_rebinding_matches_python(shared):
    """executor's C data_leaves and rebind (a sync's new leaves, storages rebound, leaves taped) against their
    Python versions: the same leaves, values, versions and tape positions."""
    from xla_dtensor.core import executor as X
    dev = xla_dtensor.device()
    got = []
    for leaves_of, rebind in ((native.MODULE.data_leaves, native.MODULE.rebind), (X._data_leaves_py, X._rebind_py)):
        ts = [torch.full((2,), float(i)).to(dev) for i in range(3)]
        pending = [T.storage_of(t) for t in ts]
        arrays = [T.value_of(t).data for t in ts[:2]]
        keys = [(T.value_of(t).key, T.value_of(t).hash) for t in ts[:2]]
        where = [0, 1, 0] if shared else None
        with threads.held():
            ir.clear_cons()
            leaves = leaves_of(keys, arrays, ir.DATA)
            rebind(pending if shared else pending[:2], where, leaves)
            tape, base = ir.recorded()
        got.append(([(n.op, n.key, n.inputs, n.hash, n.fn, n.data is a) for n, a in zip(leaves, arrays)],
                    [(s.value is leaves[k], s.version) for s, k in zip(pending, where or [0, 1])],
                    [n.tix - base for n in leaves], tape[-2:] == leaves))
    assert got[0] == got[1]
    assert got[0][2] == [len(ir.recorded()[0]) - 2, len(ir.recorded()[0]) - 1] and got[0][3]


@needs_native
def test_an_op_error_propagates_and_leaves_the_core_unlocked():
    dev = xla_dtensor.device()
    a, b = torch.ones(3, device=dev), torch.ones(4, device=dev)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(3\) must match the size of tensor b \(4\)"):
        a + b
    assert STATE.owner == 0 and not threads.LOCK._is_owned()
    assert (a * 2 + 1).tolist() == [3.0, 3.0, 3.0]


# ---------------------------------------------------------------- the two paths end to end

_SCRIPT = textwrap.dedent('''
    import json, os, sys, warnings
    sys.path.insert(0, {root!r})
    warnings.simplefilter("ignore")
    from benchmarks.models.torchvision_shim import install
    install()  # transformers imports torchvision, whose C++ ops do not load on CPU torch
    import torch, torch.nn.functional as F
    import xla_dtensor
    from xla_dtensor import metrics
    from xla_dtensor.core import native
    from tests._train import sharded_mlp, train
    dev = xla_dtensor.device()
    batches = [(torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(s)),
                torch.randn(4, 8, 8, generator=torch.Generator().manual_seed(s + 50))) for s in range(3)]
    cxx = sys.modules.get("xla_dtensor.core.cxx")  # (imported by the C path only)
    on = cxx is not None and cxx.MODULE is not None
    kernel = lambda: cxx.MODULE.calls()[0] if on else 0  # noqa: E731
    linear = lambda: cxx.MODULE.linear_calls()[0] if on else 0  # noqa: E731
    attention = lambda: cxx.MODULE.attention_calls()[0] if on else 0  # noqa: E731
    out = {{"native": native.ON, "cxx": on}}

    def mlp():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))

    def gpt2():
        from transformers import GPT2Config, GPT2LMHeadModel
        torch.manual_seed(0)
        cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=2, n_head=2,
                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        return GPT2LMHeadModel(cfg)

    ids = [(torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(s)),) for s in range(3)]
    for mode in {modes!r}:
        c0, k0, l0, a0 = metrics.counters(), kernel(), linear(), attention()
        if mode == "hf-gpt2":
            model = gpt2().to(dev)
            losses = train(lambda i: model(input_ids=i, labels=i).loss, ids,
                           torch.optim.AdamW(model.parameters(), lr=1e-2), put=lambda t: t.to(dev),
                           sync=xla_dtensor.sync)
        elif mode == "cpu-hf-gpt2":
            model = gpt2()
            losses = train(lambda i: model(input_ids=i, labels=i).loss, ids, torch.optim.AdamW(model.parameters(), lr=1e-2))
        elif mode == "cpu":
            model = mlp()
            losses = train(lambda x, y: F.mse_loss(model(x), y), batches, torch.optim.AdamW(model.parameters(), lr=1e-2))
        else:
            model = mlp()
            model, put = (model.to(dev), lambda t: t.to(dev)) if mode == "one" else sharded_mlp(mode, model, dev)
            losses = train(lambda x, y: F.mse_loss(model(x), y), batches,
                           torch.optim.AdamW(model.parameters(), lr=1e-2), put=put, sync=xla_dtensor.sync)
        c1 = metrics.counters()
        out[mode] = {{"losses": losses, "kernel": kernel() - k0, "linear": linear() - l0, "attention": attention() - a0,
                     "counts": {{k: c1[k] - c0[k] for k in ("ops_recorded", "hash_cons_hits", "compiles",
                                                         "plans_reused", "fused_linear", "fused_linear_backward",
                                                         "fused_attention")}}}}
    print(json.dumps(out))
''')
MODES = ["cpu", "cpu-hf-gpt2", "one", "dp", "megatron", "fsdp", "auto", "hf-gpt2"]


def _run(native_on: bool) -> dict:
    env = _parallel.child_env({**os.environ, "PYTHONHASHSEED": "0", "XLA_DTENSOR_NATIVE": "1" if native_on else "0"},
                              __name__)
    script = _SCRIPT.format(root=str(ROOT), modes=MODES if native_on else MODES[2:])
    proc = _parallel.run([sys.executable, "-c", script], env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _both_paths() -> Results:
    return Results(_run, [True, False])


def start_early(session: pytest.Session) -> None:
    """Both paths' training runs start when collection ends, in the background (tests/_parallel.py)."""
    if native.ON and _parallel.selected_in(session, sys.modules[__name__], "mode"):
        _parallel.start_early(__name__, _both_paths)


@pytest.fixture(scope="module")
def runs() -> Results:
    return _parallel.early(__name__, _both_paths)


@needs_native
@pytest.mark.parametrize("mode", MODES[2:])
def test_both_paths_train_like_cpu_and_record_the_same(mode, runs):
    c, p = runs[True], runs[False]
    assert c["native"] and not p["native"]
    if c["cxx"]:  # the C path's ops went through the C++ kernel at the Python key (sharded classes too)
        assert c[mode]["kernel"] > 0 and p[mode]["kernel"] == 0
        # and its F.linear calls through the C++ linear kernel, recording what the Python route records
        assert c[mode]["linear"] == c[mode]["counts"]["fused_linear"] > 0 and p[mode]["linear"] == 0
        # and transformers' GPT-2 its attention through the C++ attention node
        assert c[mode]["attention"] == c[mode]["counts"]["fused_attention"] and p[mode]["attention"] == 0
        assert (c[mode]["attention"] > 0) == (mode == "hf-gpt2")
    cpu = c["cpu-hf-gpt2" if mode == "hf-gpt2" else "cpu"]["losses"]
    torch.testing.assert_close(torch.tensor(c[mode]["losses"]), torch.tensor(cpu), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(torch.tensor(c[mode]["losses"]), torch.tensor(p[mode]["losses"]), rtol=1e-6, atol=0)
    assert c[mode]["counts"] == p[mode]["counts"]
    assert c[mode]["counts"]["ops_recorded"] > 0


def test_a_missing_build_warns_and_records_in_python():
    code = textwrap.dedent(f'''
        import sys, warnings
        sys.path.insert(0, {str(ROOT)!r})
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "xla_dtensor.core._native":
                    raise ImportError("no compiler here")
        sys.meta_path.insert(0, Block())
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, xla_dtensor
        from xla_dtensor.core import native, ir
        x = torch.ones(3, device=xla_dtensor.device()) * 2.5
        print(native.ON, type(ir.Node(ir.DATA, 1, (), 1, None)).__module__, x.tolist())
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    ''')
    env = {k: v for k, v in os.environ.items() if k != "XLA_DTENSOR_NATIVE"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, warned = proc.stdout.strip().splitlines()[-2:]
    assert first == "False xla_dtensor.core.ir [2.5, 2.5, 2.5]"
    assert "xla_dtensor.core._native is not built (no compiler here)" in warned and "pip install -e ." in warned


@needs_native
def test_a_tapes_structure_matches_python():
    from xla_dtensor.core import plan_cache
    dev = xla_dtensor.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).to(dev)
    outside = torch.ones(2, device=dev) * 3  # pending before the barrier: its node is off the next tape
    ir.clear_cons()  # a new tape, as a sync starts (a host read's keeps the live nodes: core.ir.partial_barrier)
    loss = model(torch.randn(3, 4).to(dev)).sum()
    loss.backward()
    tape, base = ir.recorded()
    roots = [T.value_of(p.grad) for p in model.parameters()] + [T.value_of(loss)]
    key, leaves = plan_cache._c_structure(tape, base, roots)
    want = plan_cache._structure_py(tape, base, roots)
    assert key + plan_cache._sharding_codes(tape).tobytes() == want[0] and tape + leaves == want[1]
    assert leaves and all(n.fn is None for n in leaves)
    off_tape = [T.value_of(outside)]  # an op node recorded before the barrier: the walk, not the tape
    assert plan_cache._c_structure(tape, base, off_tape) is None and plan_cache._structure_py(tape, base, off_tape) is None
    assert plan_cache._c_structure([ir.PYTHON["Node"]("x", 1, (), 1, None)], base, []) is NotImplemented
    xla_dtensor.sync()


@needs_native
def test_a_replaced_param_leaf_is_called(monkeypatch):
    """compile's tracer (jit.hyper) watches the scalar parameters the core makes by replacing
    signature.param_leaf: the C signature calls the replacement, as the Python one does."""
    seen = []
    make = S.param_leaf
    monkeypatch.setattr(S, "param_leaf", lambda v: seen.append(v) or make(v))
    dyn: list = []
    x = torch.ones(2, device=xla_dtensor.device())
    S.signature((x, 2.5), {"alpha": 3}, S.op_info(torch.ops.aten.add.Tensor), True, dyn)
    assert seen == [2.5, 3] and [n.data for n in dyn[1:]] == [2.5, 3]


# ---------------------------------------------------------------- sharded tensors and sticky layouts

@needs_native
def test_sharded_tensors_enter_c_and_get_what_their_python_entry_gives():
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Shard
    from xla_dtensor.spmd import sharded_tensor as ST
    cls, aten = ST.XLAShardedTensor, torch.ops.aten
    assert cls.__torch_dispatch__.__func__ is T.LazyTensor.__torch_dispatch__.__func__
    dev = xla_dtensor.device()
    mesh = DeviceMesh("xla", list(range(4)))
    torch.manual_seed(0)
    host, other = torch.randn(4, 8), torch.randn(4, 8)
    d = xla_dtensor.distribute_tensor(host, mesh, [Shard(0)])
    cases = [  # (op, args maker): a plain result, a tuple, an in-place op returning its plain input, and
        (aten.add.Tensor, lambda: (d, other.to(dev))),  # empty_like, which the Python side lays out
        (aten.native_layer_norm.default, lambda: (d, [8], None, None, 1e-5)),
        (aten.add_.Tensor, lambda: (other.to(dev), d)),
        (aten.empty_like.default, lambda: (d,)),
    ]
    for op, args in cases:
        got, want = cls.__torch_dispatch__(op, (cls,), args(), {}), ST.PYTHON_ENTRY(cls, op, (cls,), args(), {})
        assert type(got) is type(want), op
        for g, w in zip(got, want) if isinstance(got, tuple) else [(got, want)]:
            assert type(g) is type(w) is cls, op
            assert g.placements == w.placements, op
            if op is not aten.empty_like.default:
                torch.testing.assert_close(g.full_tensor().cpu(), w.full_tensor().cpu())
    y = d * 2  # through torch
    assert type(y) is cls and y.placements == d.placements
    torch.testing.assert_close(y.full_tensor().cpu(), host * 2)
    xla_dtensor.sync()


@needs_native
def test_stored_shardings_matches_python(monkeypatch):
    """The C look-ups of layout.stored_shardings give what its Python loop gives: an even known layout's
    sharding, None without a layout, and new or uneven layouts laid out by Python (uneven ones listed)."""
    from xla_dtensor.core import layout as L
    from xla_dtensor.sharding import ShardingSpec
    from torch.distributed.tensor import Replicate, Shard
    from mesh import Mesh
    dev = xla_dtensor.device()
    m = Mesh(range(8), (2, 4), ("data", "model"))
    a, b = (ShardingSpec.from_placements(m, p, 2) for p in ([Shard(0), Replicate()], [Replicate(), Shard(1)]))
    ts = [torch.ones(4, 8, device=dev) * k for k in range(4)] + [torch.ones(4, 6, device=dev)]  # 6 % 4: uneven
    stores = [T.storage_of(t) for t in ts]
    for s, layout in zip(stores, (a, b, None, a, b)):
        s.layout = layout
    L._LAID.clear()
    L.laid(a, (4, 8))  # known; b at (4, 8) is new, b at (4, 6) uneven

    def run(c_path: bool) -> tuple[list, list]:
        L._LAID.clear()
        L.laid(a, (4, 8))
        if not c_path:
            monkeypatch.setattr(L, "_c_stored_shardings", None)
        return L.stored_shardings(list(stores))
    got_c, got_p = run(True), run(False)
    want = ([L.named(a), L.named(b), None, L.named(a), None], [stores[4]])
    assert got_c == got_p == want
    assert got_c[0][0] is L.named(a)
    py = T.PYTHON["Storage"](stores[0].value, stores[0].meta)
    assert native.MODULE.stored_shardings([py], L._LAID) is NotImplemented
    monkeypatch.undo()
    for s in stores:
        s.layout = None
    xla_dtensor.sync()


@needs_native
@pytest.mark.parametrize("consing", [True, False], ids=["lazy", "eager"])
def test_constrain_stored_matches_python(consing, monkeypatch):
    from xla_dtensor.core import layout as L
    from xla_dtensor.sharding import ShardingSpec
    from torch.distributed.tensor import Replicate, Shard
    from mesh import Mesh
    dev = xla_dtensor.device()
    m = Mesh(range(8), (2, 4), ("data", "model"))
    a, b = (ShardingSpec.from_placements(m, p, 2) for p in ([Shard(0), Replicate()], [Replicate(), Shard(1)]))
    sa = L.named(a)
    table = {(id(a), (4, 8)): (a, sa, *L.constraint_key(sa))}
    ts = [torch.ones(4, 8, device=dev) * k for k in range(5)]
    stores = [T.storage_of(t) for t in ts]
    stores[3].value = L.constrain(stores[3].value, sa)  # already constrained: kept
    for s, layout in zip(stores, (a, b, None, a, a)):
        s.layout = layout
    wide = torch.ones(2, 8, device=dev)  # a known layout at another shape: not in the table
    T.storage_of(wide).layout = a
    stores.append(T.storage_of(wide))
    before = [s.value for s in stores]
    monkeypatch.setattr(STATE, "consing", consing)

    def run(c_path: bool) -> tuple[list, list]:
        for s, v in zip(stores, before):
            s.value = v
        if not c_path:
            monkeypatch.setattr(L, "_c_constrain_stored", None)
        rest = L.constrain_stored(list(stores), table)
        return rest, [s.value for s in stores]
    rest_c, got_c = run(True)
    rest_p, got_p = run(False)
    assert rest_c == rest_p == [stores[1], stores[5]]
    for i, (c, p) in enumerate(zip(got_c, got_p)):
        if i in (0, 4):
            assert c is not before[i] and (c.op, c.key, c.sharding, c.inputs) == (p.op, p.key, p.sharding, p.inputs)
            assert c.op == L.CONSTRAINT and c.sharding is sa and c.inputs == (before[i],)
        else:
            assert c is p is before[i], i
    py = T.PYTHON["Storage"](before[0], stores[0].meta)
    assert native.MODULE.constrain_stored([py], table, L.CONSTRAINT, L._identity) is NotImplemented
    monkeypatch.undo()
    for s in stores:
        s.layout = None
    xla_dtensor.sync()


# ---------------------------------------------------------------- a sync's first passes

@needs_native
def test_pending_storages_match_python():
    """The C scan of the live storages (tensor.pending) against its Python reference: the same pending storages in
    creation order and the same clean values; a dead storage is in neither; a Python storage makes C decline."""
    dev = xla_dtensor.device()
    xla_dtensor.sync()
    clean = [torch.full((2,), float(i)).to(dev) for i in range(3)]
    xla_dtensor.sync()
    late = torch.ones(3, device=dev) * 2  # created last, written first: the order is the storages' creation order
    clean[1].add_(1)
    dead = torch.ones(2, device=dev) * 5
    dead_ref = weakref.ref(T.storage_of(dead))
    del dead
    gc.collect()
    assert dead_ref() is None
    got_c, got_p = native.MODULE.pending_storages(), T.pending_py()
    assert [id(s) for s in got_c[0]] == [id(s) for s in got_p[0]]
    assert [s.seq for s in got_c[0]] == sorted(s.seq for s in got_c[0])
    assert T.storage_of(clean[1]) in got_c[0] and T.storage_of(late) in got_c[0]
    assert T.storage_of(clean[0]) not in got_c[0]
    assert sorted(map(id, got_c[1])) == sorted(map(id, got_p[1]))
    assert any(v is T.value_of(clean[0]) for v in got_c[1]) and not any(v is T.value_of(clean[1]) for v in got_c[1])
    py = T.PYTHON["Storage"](T.value_of(clean[2]), T.storage_of(clean[2]).meta)
    T.LIVE.data.add(weakref.ref(py))
    try:
        assert native.MODULE.pending_storages() is NotImplemented
        assert sum(v is py.value for v in T.pending()[1]) == 2  # the Python path: the clean value twice
    finally:
        T.LIVE.data.discard(weakref.ref(py))
    xla_dtensor.sync()
    assert late.tolist() == [2.0, 2.0, 2.0] and clean[1].tolist() == [2.0, 2.0]


@needs_native
@pytest.mark.parametrize("shared", [True, False], ids=["shared", "distinct"])
def test_distinct_values_match_python(shared):
    """executor's C pass over a sync's pending storages (values without repeats, each storage's place, the first
    storage of each value, its donor and meta) against the Python reference."""
    from xla_dtensor.core import executor as X
    dev = xla_dtensor.device()
    ts = [torch.full((2,), float(i)).to(dev) for i in range(4)]
    xla_dtensor.sync()
    for t in ts:
        t.mul_(2)
    pending = [T.storage_of(t) for t in ts]
    if shared:  # storages 1 and 3 hold storage 0's value: one output, as equal optimizer step counters
        pending[1].value = pending[3].value = pending[0].value
    got_c, got_p = native.MODULE.distinct_values(list(pending)), X._distinct_values_py(list(pending))
    assert [len(x) if isinstance(x, list) else x for x in got_c] == [len(x) if isinstance(x, list) else x for x in got_p]
    for c, p in zip(got_c, got_p):
        assert c is p is None or all(a is b or a == b for a, b in zip(c, p))
    values, where, firsts, donors, metas = got_c
    if shared:
        assert where == [0, 0, 1, 0] and [id(s) for s in firsts] == [id(pending[0]), id(pending[2])]
    else:
        assert where is None and len(values) == 4 and all(a is b for a, b in zip(firsts, pending))
    assert donors == [s.donor for s in firsts] and metas == [s.meta for s in firsts]
    py = T.PYTHON["Storage"](pending[0].value, pending[0].meta)
    assert native.MODULE.distinct_values([py]) is NotImplemented
    with pytest.raises(TypeError, match="a list of storages"):
        native.MODULE.distinct_values(tuple(pending))
    xla_dtensor.sync()


@needs_native
def test_split_packs_matches_python():
    """A program's packed arguments found in C (packs.split) against the Python reference: the same arguments,
    packs and wiring bytes; None without a member; the reference's members and positions from the bytes."""
    from xla_dtensor.core import packs
    dev = xla_dtensor.device()
    ws = [torch.ones(3, 2, device=dev) * k for k in range(3)] + [torch.ones(5, device=dev)]
    big = torch.ones(1, device=dev)
    xla_dtensor.sync()
    for w in ws + [big]:
        w.add_(1)
    xla_dtensor.sync()  # the second sync packs what the first laid out
    leaves = [T.value_of(w) for w in (ws[2], big, ws[0], ws[3], ws[1])]
    assert isinstance(leaves[0].raw, packs.Pack)
    got_c, got_p = native.MODULE.split_packs(leaves, packs.Pack), packs._split_py(leaves, packs.Pack)
    assert got_c[2] == got_p[2] and got_c[1] == got_p[1]
    assert all(a is b for a, b in zip(got_c[0], got_p[0])) and len(got_c[0]) == len(got_p[0])
    inputs = packs.split(leaves)
    members = [j for j, n in enumerate(leaves) if type(n.raw) is packs.Pack]
    assert [j for j, _, _ in inputs.at] == members and [i for _, _, i in inputs.at] == [leaves[j].key[4] for j in members]
    assert inputs.moved == [(-1 if j in members else sum(k not in members for k in range(j))) for j in range(5)]
    plain = [n for n in leaves if type(n.raw) is not packs.Pack]
    assert native.MODULE.split_packs(plain, packs.Pack) is None is packs._split_py(plain, packs.Pack)
    assert native.MODULE.split_packs([ir.PYTHON["Node"]("x", 1, (), 1, None)], packs.Pack) is NotImplemented


@needs_native
def test_sharding_codes_match_python():
    """The tape's sharding codes in C (plan_cache) against the Python pass; None for a sharding without a code."""
    from xla_dtensor.core import plan_cache
    from jax.sharding import NamedSharding, PartitionSpec
    import jax
    dev = xla_dtensor.device()
    x = torch.ones(4, 4, device=dev) * 2
    y = (x + 1).sum()
    tape, _ = ir.recorded()
    assert native.MODULE.sharding_codes(tape, plan_cache._CODE_BY_ID) == plan_cache._sharding_codes(tape).tobytes()
    mesh = jax.sharding.Mesh(jax.devices()[:1], ("a",))
    sh = NamedSharding(mesh, PartitionSpec())
    tape[-1].sharding = sh  # not coded yet: C declines, Python codes it
    assert native.MODULE.sharding_codes(tape, plan_cache._CODE_BY_ID) is None
    want = plan_cache._sharding_codes(tape)
    assert want[-1] > 0 and native.MODULE.sharding_codes(tape, plan_cache._CODE_BY_ID) == want.tobytes()
    tape[-1].sharding = None
    del y
    xla_dtensor.sync()
