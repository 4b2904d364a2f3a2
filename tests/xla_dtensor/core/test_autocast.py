"""torch.autocast on the jax device (xla_dtensor.core.autocast), against torch itself.

Oracles: the op lists and cast policies against torch's own ``AutocastCUDA`` kernels (run on
data-less tensors that claim the cuda device: the kernels are compiled into every torch
build), dtypes and values against CPU autocast where CPU's lists agree with CUDA's, and the
training losses of the GPT step and a tiny HF Llama against the same models under
``torch.autocast("cpu", torch.bfloat16)``: lazy, compiled, 8-way DP, 2x4 TP (torch's
``parallelize_module``), FSDP and AUTO.
"""
from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import autoshard
import xla_dtensor
import xla_dtensor.spmd as xs
from autoshard.models import GPT2, GPT2Config
from xla_dtensor import metrics
from xla_dtensor.core import autocast as AC
from xla_dtensor.fsdp import shard_model
from tests._train import sharded_batch

BF16, F32 = torch.bfloat16, torch.float32
CFG = GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=2, n_head=4)
STEPS = 5
aten = torch.ops.aten


# -- the lists and policies, against torch's CUDA autocast kernels ----------------------------
def test_lists_are_exactly_cudas_autocast_registrations():
    ours = {*AC.LOWER_PRECISION, *AC.FP32, *AC.FP32_SET_OPT_DTYPE, *AC.FP32_APPEND_DTYPE, *AC.PROMOTE, *AC.BANNED}
    assert len(ours) == len(AC.LOWER_PRECISION) + len(AC.FP32) + len(AC.FP32_SET_OPT_DTYPE) + \
        len(AC.FP32_APPEND_DTYPE) + len(AC.PROMOTE) + len(AC.BANNED)  # no op in two lists
    assert {f"aten::{n}" for n in ours} == set(torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA"))
    assert set(torch._C._dispatch_get_registrations_for_dispatch_key(AC.KEY)) >= {f"aten::{n}" for n in ours}


class _Stop(Exception):
    pass


class _FirstOp(TorchDispatchMode):
    """Below autocast: let the casts run, stop at the first other op and keep it with its input dtypes."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is aten._to_copy.default:
            return func(*args, **kwargs)
        dtypes = [t.dtype for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        raise _Stop((str(func), dtypes, kwargs.get("dtype")))


class _FakeCuda(torch.Tensor):
    """A data-less tensor on the cuda device: torch's AutocastCUDA kernels take it."""

    @staticmethod
    def __new__(cls, meta):
        t = torch.Tensor._make_wrapper_subclass(cls, meta.shape, dtype=meta.dtype, device="cuda")
        t.meta = meta
        return t

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        assert func is aten._to_copy.default, func
        kw = {k: v for k, v in (kwargs or {}).items() if k != "device"}
        return cls(func(args[0].meta, **kw))


_SHAPES = {"v": (3,), "m": (3, 3), "b": (2, 3, 3), "i": (1, 1, 4, 4), "w": (1, 1, 1, 1)}
_CASES = {  # op, argument kinds: "<dtype><shape>" tensors (f float32, h bfloat16, l int64) or Python values
    "mm": (aten.mm.default, ["fm", "fm"]), "linear": (aten.linear.default, ["fm", "fm", "fv"]),
    "bmm": (aten.bmm.default, ["fb", "fb"]), "baddbmm": (aten.baddbmm.default, ["fb", "fb", "fb"]),
    "addmm": (aten.addmm.default, ["fv", "fm", "fm"]), "matmul": (aten.matmul.default, ["fb", "fm"]),
    "conv2d": (aten.conv2d.default, ["fi", "fw"]), "einsum": (aten.einsum.default, ["ij,jk->ik", ["fm", "fm"]]),
    "exp": (aten.exp.default, ["hm"]), "log": (aten.log.default, ["hm"]),
    "pow": (aten.pow.Tensor_Scalar, ["hm", 2]), "rsqrt": (aten.rsqrt.default, ["hm"]),
    "layer_norm": (aten.layer_norm.default, ["hm", [3]]), "group_norm": (aten.group_norm.default, ["hb", 1]),
    "nll_loss": (aten.nll_loss.default, ["hm", "lv"]), "mse_loss": (aten.mse_loss.default, ["hm", "fm"]),
    "logsumexp": (aten.logsumexp.default, ["hm", [1]]), "cdist": (aten.cdist.default, ["hm", "hm"]),
    "sum": (aten.sum.default, ["hm"]), "sum_dim": (aten.sum.dim_IntList, ["hm", [0]]),
    "cumsum": (aten.cumsum.default, ["hm", 0]), "prod": (aten.prod.default, ["hm"]),
    "vector_norm": (aten.linalg_vector_norm.default, ["hm"]), "norm": (aten.norm.Scalar, ["hm", 2]),
    "sum_given_dtype": (aten.sum.default, ["hm"], {"dtype": BF16}), "sum_int": (aten.sum.default, ["lv"]),
    "addcmul_mixed": (aten.addcmul.default, ["hv", "fv", "hv"]), "addcmul_low": (aten.addcmul.default, ["hv"] * 3),
    "dot": (aten.dot.default, ["hv", "hv"]), "atan2": (aten.atan2.default, ["hv", "fv"]),
    "index_put": (aten.index_put.default, ["hv", ["lv"], "fv"]),
    "mm_float64": (aten.mm.default, ["dm", "fm"]),
}


def _args(kinds, make):
    if isinstance(kinds, list):
        return [_args(k, make) for k in kinds]
    if isinstance(kinds, str) and kinds[:1] in "fhld" and kinds[1:] in _SHAPES:
        dt = {"f": F32, "h": BF16, "l": torch.int64, "d": torch.float64}[kinds[0]]
        return make(torch.zeros(_SHAPES[kinds[1:]], dtype=dt, device="meta"))
    return kinds


def _first_op(case, make):
    op, kinds, kw = (*_CASES[case], {})[:3]
    args = _args(kinds, make)
    with _FirstOp():
        try:
            op(*args, **kw)
        except _Stop as stop:
            return stop.args[0]
    raise AssertionError(f"{case}: no op below autocast")


@pytest.mark.parametrize("case", sorted(_CASES))
def test_cast_policy_matches_cuda_autocast(case, dev, monkeypatch):
    # below autocast the jax device records F.linear as one op (core.linear); the casts are what is compared
    monkeypatch.setattr(xla_dtensor.config, "fused_linear", False)
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", BF16)
    try:
        expected = _first_op(case, _FakeCuda)
    finally:
        torch.set_autocast_enabled("cuda", False)
    with torch.autocast("jax", dtype=BF16):
        got = _first_op(case, lambda m: torch.zeros(m.shape, dtype=m.dtype).to(dev))
    assert got == expected


# -- single ops: dtypes and values against CPU autocast ---------------------------------------
def _op_inputs():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return {"x": r(4, 8), "w": r(6, 8), "bias": r(6), "b1": r(2, 4, 8), "b2": r(2, 8, 5), "c": r(2, 4, 5),
            "img": r(1, 2, 5, 5), "k": r(3, 2, 3, 3), "t": torch.randint(0, 6, (4,), generator=g)}


_AGREE = {  # ops where CPU's and CUDA's autocast lists agree (or neither lists them)
    "linear": lambda a: F.linear(a["x"], a["w"], a["bias"]), "matmul": lambda a: a["x"] @ a["w"].T,
    "mm": lambda a: torch.mm(a["x"], a["w"].T), "bmm": lambda a: torch.bmm(a["b1"], a["b2"]),
    "baddbmm": lambda a: torch.baddbmm(a["c"], a["b1"], a["b2"]),
    "addmm": lambda a: torch.addmm(a["bias"], a["x"], a["w"].T), "conv2d": lambda a: F.conv2d(a["img"], a["k"]),
    "cross_entropy": lambda a: F.cross_entropy(F.linear(a["x"], a["w"]), a["t"]),
    "nll_loss": lambda a: F.nll_loss(F.linear(a["x"], a["w"]), a["t"]),
    "mse_loss": lambda a: F.mse_loss(F.linear(a["x"], a["w"]), a["x"][:, :6]),
    "gelu_of_linear": lambda a: F.gelu(F.linear(a["x"], a["w"])), "add": lambda a: a["x"] + 1,
    "sdpa": lambda a: F.scaled_dot_product_attention(a["b1"], a["b1"], a["b1"], is_causal=True),
}
_NOT_FP16 = {"sdpa"}  # NOTE: float16 SDPA fails on CPU without autocast too (dot_general precision F16_F16_F32)


@pytest.mark.parametrize("dtype", [BF16, torch.float16])
def test_op_dtypes_and_values_match_cpu_autocast(dev, dtype):
    cpu = _op_inputs()
    ours = {k: v.to(dev) for k, v in cpu.items()}
    ops = {name: f for name, f in _AGREE.items() if dtype == BF16 or name not in _NOT_FP16}
    with torch.autocast("jax", dtype=dtype):
        got = {name: f(ours) for name, f in ops.items()}
    with torch.autocast("cpu", dtype=dtype):
        want = {name: f(cpu) for name, f in ops.items()}
    plain = {name: f(ours).dtype for name, f in ops.items()}
    xla_dtensor.sync()
    for name in ops:
        assert got[name].dtype == want[name].dtype, name
        assert plain[name] == F32, name
        torch.testing.assert_close(got[name].cpu(), want[name], rtol=2e-2, atol=2e-2, msg=name)
    assert got["linear"].dtype == dtype and got["cross_entropy"].dtype == F32


def test_softmax_norms_and_reductions_run_in_float32_like_cuda(dev):
    """CUDA's fp32 list: a low-precision activation goes through softmax, layer norm, sum, exp in float32
    (CPU autocast leaves these ops to the input's dtype; on a float32 input both give float32)."""
    cpu = _op_inputs()
    x, w = cpu["x"].to(dev), cpu["w"].to(dev)
    ln = torch.nn.LayerNorm(6).to(dev)
    with torch.autocast("jax", dtype=BF16):
        h = F.linear(x, w)
        outs = {"softmax": h.softmax(-1), "log_softmax": F.log_softmax(h, -1), "layer_norm": ln(h),
                "sum": h.sum(), "exp": h.exp(), "softmax_given_dtype": torch.softmax(h, -1, dtype=BF16)}
        f32 = {"softmax_f32_input": x.softmax(-1)}
    with torch.autocast("cpu", dtype=BF16):
        cpu_f32 = {"softmax_f32_input": cpu["x"].softmax(-1)}
    assert h.dtype == BF16
    xla_dtensor.sync()
    hf = h.cpu().float()
    want = {"softmax": hf.softmax(-1), "log_softmax": F.log_softmax(hf, -1), "sum": hf.sum(), "exp": hf.exp(),
            "layer_norm": F.layer_norm(hf, (6,))}
    for name, v in want.items():
        assert outs[name].dtype == F32, name
        torch.testing.assert_close(outs[name].cpu(), v, rtol=1e-5, atol=1e-5, msg=name)
    assert outs["softmax_given_dtype"].dtype == BF16  # the caller's dtype wins, as on CUDA
    assert f32["softmax_f32_input"].dtype == cpu_f32["softmax_f32_input"].dtype == F32
    torch.testing.assert_close(f32["softmax_f32_input"].cpu(), cpu_f32["softmax_f32_input"])


def test_float16_training_with_grad_scaler_matches_cpu(dev):
    """GradScaler's unscale and scale update (xla_dtensor.ops.optim): an overflow step skipped and
    backed off, clean steps grow the scale, losses and weights as on CPU."""
    torch.manual_seed(0)
    model, x = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)), torch.randn(16, 8)
    runs = {}
    for device in ("cpu", "jax"):
        m = copy.deepcopy(model).to(device)
        opt = _sgd(m.parameters())
        scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 18, growth_interval=2)
        losses, scales = [], []
        for _ in range(3):  # on CPU: an overflow at step 1 (backed off), 2 clean steps (grown)
            with torch.autocast(device, dtype=torch.float16):
                loss = m(x.to(device)).float().square().mean()
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            losses.append(loss.item())
            scales.append(scaler.get_scale())
        runs[device] = losses, scales, [p.detach().cpu() for p in m.parameters()]
    (cpu_losses, cpu_scales, cpu_params), (losses, scales, params) = runs["cpu"], runs["jax"]
    assert scales == cpu_scales, (scales, cpu_scales)
    steps = list(zip([2.0 ** 18] + cpu_scales, cpu_scales))
    assert any(b < a for a, b in steps) and any(b > a for a, b in steps), cpu_scales  # backed off and grown
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-2, atol=0)
    for p, q in zip(params, cpu_params):
        torch.testing.assert_close(p, q, rtol=1e-2, atol=1e-3)


def test_eager_mode_forward_and_backward_match_cpu_autocast(dev):
    torch.manual_seed(0)
    lin, x = torch.nn.Linear(8, 4), torch.randn(2, 8)
    m = copy.deepcopy(lin).to(dev)
    with torch.autocast("cpu", dtype=BF16):
        want = lin(x)
    want.float().square().sum().backward()
    xla_dtensor.eager_mode(True)
    try:
        with torch.autocast("jax", dtype=BF16):
            got = m(x.to(dev))
        got.float().square().sum().backward()
    finally:
        xla_dtensor.eager_mode(False)
    assert got.dtype == BF16 and m.weight.grad.dtype == F32
    torch.testing.assert_close(got.cpu(), want)
    torch.testing.assert_close(m.weight.grad.cpu(), lin.weight.grad, rtol=1e-2, atol=1e-2)


# -- the autocast state: queries, nesting, bad input ----------------------------------------
def test_state_queries_nested_and_disabled_regions(dev):
    lin = torch.nn.Linear(4, 4).to(dev)
    x = torch.ones(2, 4, device=dev)
    assert not torch.is_autocast_enabled("jax") and AC.state() is None
    with torch.autocast("jax", dtype=BF16):
        assert torch.is_autocast_enabled("jax") and torch.get_autocast_dtype("jax") == BF16
        assert not torch.is_autocast_enabled("cpu")
        a = lin(x)
        with torch.autocast("jax", enabled=False):
            assert not torch.is_autocast_enabled("jax")
            b = lin(x)
        with torch.autocast("jax", dtype=torch.float16):
            assert torch.get_autocast_dtype("jax") == torch.float16 and AC.state() == torch.float16
            c = lin(x)
        with torch.autocast("cpu", dtype=BF16):  # another device's region leaves ours alone
            d = lin(x)
        e = lin(x)
    assert (a.dtype, b.dtype, c.dtype, d.dtype, e.dtype, lin(x).dtype) == (BF16, F32, torch.float16, BF16, BF16, F32)
    assert not torch.is_autocast_enabled("jax")


def test_unsupported_dtype_is_refused_naming_the_allowed_ones(dev):
    lin = torch.nn.Linear(4, 4).to(dev)
    x = torch.ones(2, 4, device=dev)
    with pytest.warns(UserWarning, match=r"jax Autocast only supports dtypes of torch\.float16, torch\.bfloat16"):
        with torch.autocast("jax", dtype=torch.float64):
            assert lin(x).dtype == F32  # torch disabled the region
    prev = torch.get_autocast_dtype("jax")
    torch.set_autocast_dtype("jax", torch.float64)  # around torch.autocast's check
    torch.set_autocast_enabled("jax", True)
    try:
        with pytest.raises(AC.AutocastDtypeError, match=r"casts to torch\.float16, torch\.bfloat16; "
                                                        r"torch\.get_autocast_dtype\('jax'\) is torch\.float64"):
            lin(x)
    finally:
        torch.set_autocast_enabled("jax", False)
        torch.set_autocast_dtype("jax", prev)
    with torch.autocast("jax", dtype=BF16):
        with pytest.raises(RuntimeError, match="unsafe to autocast"):
            F.binary_cross_entropy(torch.sigmoid(x), x)
        with pytest.raises(AC.AutocastDtypeError, match=r"torch\.float16 beside torch\.bfloat16"):
            torch.addcmul(x.bfloat16(), x.half(), x.bfloat16())


# -- training: the GPT step and a tiny HF Llama against CPU autocast ----------------------------
def _batches(n, vocab=64, batch=8, seq=16):
    g = torch.Generator().manual_seed(1)
    return [(torch.randint(0, vocab, (batch, seq), generator=g), torch.randint(0, vocab, (batch, seq), generator=g))
            for _ in range(n)]


def _gpt_loss(model, x, y):
    return model(x, y)


def _llama_loss(model, x, y):
    return model(input_ids=x, labels=y).loss


def _train_step(loss_fn, model, opt, x, y, device_type):
    with torch.autocast(device_type, dtype=BF16):
        loss = loss_fn(model, x, y)
    loss.backward()
    opt.step()
    opt.zero_grad()
    return loss


def _cpu_losses(loss_fn, model, opt_fn, bs):
    model, opt = copy.deepcopy(model), None
    opt = opt_fn(model.parameters())
    return [_train_step(loss_fn, model, opt, x, y, "cpu").item() for x, y in bs]


def _sgd(params):
    return torch.optim.SGD(params, lr=0.5)


@pytest.fixture(scope="module")
def gpt():
    torch.manual_seed(0)
    model, bs = GPT2(CFG), _batches(STEPS)
    return model, bs, _cpu_losses(_gpt_loss, model, _sgd, bs)


def _close(got, want):
    torch.testing.assert_close(torch.tensor(got), torch.tensor(want), rtol=1e-2, atol=0)


def test_gpt_compiled_steps_match_cpu_autocast_without_recompiling(gpt, dev):
    model, bs, ref = gpt
    m = copy.deepcopy(model).to(dev)
    opt = _sgd(m.parameters())
    step = xla_dtensor.compile(lambda m, opt, x, y: _train_step(_gpt_loss, m, opt, x, y, "jax"))
    got = [step(m, opt, x.to(dev), y.to(dev)).item() for x, y in bs[:2]]
    before = metrics.counters()["compiles"]
    got += [step(m, opt, x.to(dev), y.to(dev)).item() for x, y in bs[2:]]
    assert metrics.counters()["compiles"] - before == 0
    _close(got, ref)
    assert all(p.dtype == F32 for p in m.parameters())


def test_compiled_function_retraces_when_autocast_state_changes(dev):
    lin = torch.nn.Linear(4, 4).to(dev)
    f = xla_dtensor.compile(lambda x: lin(x))
    x = torch.ones(2, 4, device=dev)
    dtypes = [f(x).dtype]
    with torch.autocast("jax", dtype=BF16):
        dtypes += [f(x).dtype, f(x).dtype]
    with torch.autocast("jax", dtype=torch.float16):
        dtypes.append(f(x).dtype)
    dtypes.append(f(x).dtype)
    assert dtypes == [F32, BF16, BF16, torch.float16, F32]


@pytest.fixture(scope="module")
def llama():
    from benchmarks.models.torchvision_shim import install
    install()  # transformers' Llama imports torchvision, whose only 2.13 wheel is a CUDA build (see the shim)
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg), _batches(STEPS, batch=2)


def test_hf_llama_lazy_steps_match_cpu_autocast(llama, dev):
    model, bs = llama
    ref = _cpu_losses(_llama_loss, model, _sgd, bs)
    m = copy.deepcopy(model).to(dev)
    opt = _sgd(m.parameters())
    got = []
    for x, y in bs:
        got.append(_train_step(_llama_loss, m, opt, x.to(dev), y.to(dev), "jax"))
        xla_dtensor.sync()
    _close([t.item() for t in got], ref)


def test_hf_llama_built_in_bf16_matches_cpu(llama, dev):
    """A model in bfloat16 throughout (``.to(torch.bfloat16)``, as ``from_config(torch_dtype=...)`` builds it)."""
    model, bs = llama
    cpu = copy.deepcopy(model).to(BF16)
    ref = _cpu_losses(_llama_loss, cpu, _sgd, bs[:2])
    m = copy.deepcopy(model).to(BF16).to(dev)
    assert all(p.dtype == BF16 for p in m.parameters())
    opt = _sgd(m.parameters())
    got = []
    for x, y in bs[:2]:
        got.append(_train_step(_llama_loss, m, opt, x.to(dev), y.to(dev), "jax"))
        xla_dtensor.sync()
    _close([t.item() for t in got], ref)


# -- sharded: DP, TP (torch's parallelize_module), FSDP, AUTO --------------------------------------
COLWISE = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "mlp.c_fc")
ROWWISE = ("attn.c_proj", "mlp.c_proj")


_LAYOUTS = {"tp": {"h.0.attn.q_proj.weight": ("model", None), "h.0.mlp.c_proj.weight": (None, "model")},
            "fsdp": {"h.0.mlp.c_fc.weight": ("fsdp", None), "h.0.mlp.c_proj.weight": (None, "fsdp")}}


def _spec(t):
    """The PartitionSpec of a parameter's device data, one entry per dim (None: not split)."""
    sh = t._storage.value.data.sharding
    spec = tuple(sh.spec) + (None,) * (t.dim() - len(tuple(sh.spec)))
    return tuple(e[0] if isinstance(e, tuple) and len(e) == 1 else e for e in spec)


def _sharded(mode, model, dev):
    m = copy.deepcopy(model)
    if mode == "fsdp":
        return shard_model(m, xs.Mesh(range(8), (8,), ("fsdp",))), (lambda t: t.to(dev))
    if mode == "auto":
        mesh = xs.Mesh(range(8), (2, 4), ("data", "model"))
        return xs.distribute_module(m, mesh, partition_fn=xs.AutoPolicy(time_limit=2)), \
            (lambda t: t.to(dev))
    if mode == "tp":
        dm = DeviceMesh("xla", [[0, 1, 2, 3], [4, 5, 6, 7]], mesh_dim_names=("data", "model"))
        plan = {**{n: ColwiseParallel() for n in COLWISE}, **{n: RowwiseParallel() for n in ROWWISE}}
        for block in m.h:
            parallelize_module(block, xs.submesh(dm, "model"), plan)
        xla_dtensor.distribute_module(m, dm)
        return m, sharded_batch(xs.Mesh(range(8), (2, 4), ("data", "model")), dev)
    mesh = xs.Mesh(range(8), (8,), ("data",))
    return m.to(dev), sharded_batch(mesh, dev)


@pytest.fixture(scope="module")
def gpt_one_layer():
    torch.manual_seed(0)
    model, bs = GPT2(dataclasses.replace(CFG, n_layer=1)), _batches(3)
    return model, bs, _cpu_losses(_gpt_loss, model, _sgd, bs)


@pytest.mark.filterwarnings("ignore::autoshard.solver.SolverTimeoutWarning")
@pytest.mark.parametrize("mode", ["dp", "tp", "fsdp", "auto"])
def test_sharded_steps_match_cpu_autocast(gpt_one_layer, dev, mode, monkeypatch):
    model, bs, ref = gpt_one_layer
    graphs = []
    solve = autoshard.solve
    monkeypatch.setattr(autoshard, "solve", lambda graph, *a, **k: graphs.append(graph) or solve(graph, *a, **k))
    m, put = _sharded(mode, model, dev)
    opt = _sgd(m.parameters())
    got = []
    for x, y in bs:
        got.append(_train_step(_gpt_loss, m, opt, put(x), put(y), "jax"))
        xla_dtensor.sync()
    _close([t.item() for t in got], ref)
    params = dict(m.named_parameters())
    if mode in _LAYOUTS:  # the parameters kept the mode's layout
        for name, spec in _LAYOUTS[mode].items():
            assert _spec(params[name]) == spec, name
    if mode == "auto":  # the plan was costed on the autocast graph: its matmuls move bfloat16 bytes
        (graph,) = graphs
        products = (["mm"], ["addmm"], ["bmm"], ["linear"], ["linear_backward"])
        mms = [n for n in graph.nodes if n.op.split(".")[-2:-1] in products]
        assert mms and all(n.out.dtype == "bfloat16" and n.out.nbytes == 2 * n.out.numel for n in mms), \
            [(n.op, n.out) for n in mms]
        assert m._auto_plan is not None
