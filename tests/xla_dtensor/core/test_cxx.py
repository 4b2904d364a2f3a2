"""The core's C++ part (``core/_cxx.cpp``, built by ``core/cxx.py``) against torch's own.

Oracles: ``torch.Tensor._make_wrapper_subclass``, which the tensor maker replaces, called with
the same class and metadata; torch's Python fallback, which the kernel at the Python key
replaces for the hot ops: the arguments a dispatch mode is given (torch presents them the same
way to modes and subclasses) and the results with the kernel switched off; torch CPU for the
values of a model run each way. The sharded and transformers runs of ``test_native`` (the C
recorder with this part against the Python recorder without it) cover it on DP, 2x4 Megatron,
FSDP and AUTO.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import xla_dtensor
from torch.utils._python_dispatch import TorchDispatchMode

from xla_dtensor.core import cxx, dispatch as D, native, tensor as T

ROOT = Path(__file__).resolve().parents[3]
needs_maker = pytest.mark.skipif(cxx.MODULE is None, reason=f"the core's C++ part is not in use: {cxx.REASON}")
aten = torch.ops.aten

METAS = [
    ((2, 3), torch.float32, (3, 1)),
    ((), torch.float32, ()),
    ((4, 5), torch.bfloat16, (1, 4)),  # transposed
    ((2, 0, 3), torch.int64, (3, 3, 1)),  # a zero-size dimension
    ((3, 2), torch.float16, (4, 2)),  # a strided slice
    ((6,), torch.bool, (1,)),
]


def test_the_dev_install_builds_the_cxx_part():
    """dev.py builds it at setup: CI without it would time the slower path silently."""
    if not native.ON or os.environ.get("XLA_DTENSOR_CXX") == "0":
        pytest.skip("the C recorder or the maker is switched off")
    assert cxx.MODULE is not None, cxx.REASON
    assert cxx.target().exists() and str(cxx.MODULE.__file__) == str(cxx.target())
    assert set(cxx.TAKEN) == set(cxx.HOT_OPS)  # each one's argument and result types convert


@needs_maker
@pytest.mark.parametrize("meta", METAS, ids=lambda m: f"{tuple(m[0])}-{m[1]}-{tuple(m[2])}")
def test_made_tensors_are_what_make_wrapper_subclass_makes(meta):
    dev = xla_dtensor.device()
    shape, dtype, stride = meta
    ours = cxx.MODULE.make_tensor(T.LazyTensor, meta, dev)
    torchs = torch.Tensor._make_wrapper_subclass(T.LazyTensor, shape, strides=stride, dtype=dtype, device=dev)
    for t in (ours, torchs):
        assert type(t) is T.LazyTensor
    assert (ours.shape, ours.stride(), ours.dtype, ours.device) == (torchs.shape, torchs.stride(), torchs.dtype,
                                                                    torchs.device) == (torch.Size(shape), stride,
                                                                                       dtype, dev)
    assert str(torch._C._dispatch_keys(ours)) == str(torch._C._dispatch_keys(torchs))
    assert "Python" in str(torch._C._dispatch_keys(ours))  # its ops reach LazyTensor.__torch_dispatch__
    assert ours.untyped_storage().nbytes() == torchs.untyped_storage().nbytes()
    assert (ours.requires_grad, ours.is_leaf, ours._is_view(), ours.storage_offset()) == (False, True, False, 0)
    assert ours.is_contiguous() == torchs.is_contiguous()


@needs_maker
def test_bad_metadata_is_refused_with_what_was_given():
    dev = xla_dtensor.device()
    make = cxx.MODULE.make_tensor
    with pytest.raises(TypeError, match=r"shape must be a tuple of ints, got list"):
        make(T.LazyTensor, ([2, 3], torch.float32, (3, 1)), dev)
    with pytest.raises(TypeError, match=r"make_tensor\(cls, \(shape, dtype, stride\), device\)"):
        make(T.LazyTensor, ((2, 3), "float32", (3, 1)), dev)
    with pytest.raises(TypeError, match=r"make_tensor\(cls, \(shape, dtype, stride\), device\)"):
        make(T.LazyTensor, ((2, 3), torch.float32, (3, 1)), "jax:0")
    with pytest.raises(ValueError, match=r"shape has 2 dims, stride 1"):
        make(T.LazyTensor, ((2, 3), torch.float32, (1,)), dev)


def _train(dev: torch.device) -> list[float]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 4)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x = torch.randn(6, 8).to(dev)
    losses = []
    for _ in range(3):
        loss = model(x).transpose(0, 1).reshape(-1).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


@needs_maker
def test_a_model_trains_alike_with_and_without_the_cxx_part():
    """The same steps recorded with torch's tensor maker and fallback, and with ours: both equal torch CPU's."""
    cpu = _train(torch.device("cpu"))
    before = cxx.MODULE.calls()
    ours = _train(xla_dtensor.device())
    taken = cxx.MODULE.calls()[0] - before[0]
    native.MODULE.configure_maker(None)
    was = cxx.MODULE.enable(False)
    try:
        before = cxx.MODULE.calls()
        torchs = _train(xla_dtensor.device())
        assert cxx.MODULE.calls()[0] == before[0]  # switched off, it took nothing
    finally:
        native.MODULE.configure_maker(cxx.MODULE.MAKE)
        cxx.MODULE.enable(was)
    assert taken > 50  # the model's hot ops went through the kernel
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(cpu), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(ours), torch.tensor(torchs), rtol=0, atol=0)


# calls whose arguments take each conversion: positional defaults dropped, keyword-only ones kept when
# not at their default, dtypes, memory formats, devices, int lists, optional tensors, tensor lists, Scalars
CALLS = [
    ("add", lambda x, y: aten.add.Tensor(x, y)),
    ("add alpha", lambda x, y: aten.add.Tensor(x, y, alpha=2)),
    ("mul scalar", lambda x, y: aten.mul.Scalar(x, 0.5)),
    ("mul wrapped number", lambda x, y: x * 0.5),  # torch gives a Python number, not its 0-d tensor
    ("add_ wrapped number", lambda x, y: x.clone().add_(2)),
    ("sum dim keepdim dtype", lambda x, y: aten.sum.dim_IntList(x, [1], True, dtype=torch.float64)),
    ("sum dim", lambda x, y: aten.sum.dim_IntList(x, [0])),
    ("clone memory format", lambda x, y: aten.clone.default(x, memory_format=torch.contiguous_format)),
    ("to copy", lambda x, y: aten._to_copy.default(x, dtype=torch.bfloat16, device=x.device)),
    ("ones like", lambda x, y: aten.ones_like.default(x, dtype=torch.int32)),
    ("transpose", lambda x, y: aten.transpose.int(x, 0, 1)),
    ("view", lambda x, y: aten.view.default(x, [6, 2])),
    ("split", lambda x, y: aten.split.Tensor(x, 1, 1)),
    ("cat", lambda x, y: aten.cat.default([x, y], 1)),
    ("layer norm", lambda x, y: aten.native_layer_norm.default(x, [4], None, y[0], 1e-5)),
    ("layer norm backward bool list", lambda x, y: aten.native_layer_norm_backward.default(
        y, x, [4], x.mean(1, keepdim=True), x.var(1, keepdim=True), y[0], None, [True, True, False])),
    ("gelu string", lambda x, y: aten.gelu.default(x, approximate="tanh")),
    ("gelu backward", lambda x, y: aten.gelu_backward.default(y, x)),
    ("where", lambda x, y: aten.where.self(x > 0, x, y)),
    ("detach", lambda x, y: aten.detach.default(x)),
]


class _Seen(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def _same(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return a is b
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


@needs_maker
@pytest.mark.parametrize("name,call", CALLS, ids=[c[0] for c in CALLS])
def test_the_entry_gets_the_arguments_torch_gives(name, call, monkeypatch):
    """What the kernel hands the entry equals what torch's fallback hands a mode for the same call, and the
    results equal torch CPU's."""
    dev = xla_dtensor.device()
    x, y = torch.randn(3, 4).to(dev), torch.randn(3, 4).to(dev)
    entered: list[tuple] = []
    original = D.dispatch

    def spy(op, args, kwargs):  # noqa: ANN001, ANN202
        entered.append((op, args, kwargs))
        return original(op, args, kwargs)

    monkeypatch.setattr(D, "dispatch", spy)
    before = cxx.MODULE.calls()[0]
    got = call(x, y)
    assert cxx.MODULE.calls()[0] > before, "the kernel did not take the call"
    mode = _Seen()
    with mode:
        call(x, y)
    op, args, kwargs = mode.calls[-1]
    assert entered[-1][0] is op
    assert _same(entered[-1][1], args) and _same(entered[-1][2], kwargs), (entered[-1], (args, kwargs))
    expected = call(x.cpu(), y.cpu())
    for g, e in zip(got if isinstance(got, (list, tuple)) else [got], expected if isinstance(
            expected, (list, tuple)) else [expected]):
        if e is None:  # an output the call did not ask for
            assert g is None
            continue
        assert g.dtype == e.dtype and g.shape == e.shape and g.stride() == e.stride()
        torch.testing.assert_close(g.cpu(), e, rtol=1e-5, atol=1e-5)


@needs_maker
def test_modes_other_subclasses_and_a_replaced_entry_take_torchs_way(monkeypatch):
    dev = xla_dtensor.device()
    x = torch.ones(2, 3, device=dev)

    class Wrap(torch.Tensor):  # another subclass around a lazy tensor: its own __torch_dispatch__ runs
        seen: list = []

        @staticmethod
        def __new__(cls, inner):  # noqa: ANN001, ANN205
            return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype, device=inner.device)

        def __init__(self, inner):  # noqa: ANN001
            self.inner = inner

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
            cls.seen.append(func)
            unwrap = [a.inner if isinstance(a, Wrap) else a for a in args]
            return func(*unwrap, **(kwargs or {}))

    fast, other = cxx.MODULE.calls()
    out = aten.add.Tensor(Wrap(x), x)
    assert Wrap.seen == [aten.add.Tensor] and type(out) is T.LazyTensor and out.cpu().tolist() == [[2.0] * 3] * 2
    assert cxx.MODULE.calls()[1] > other  # the Wrap call went torch's way (the inner add took the kernel)

    mode = _Seen()
    with mode:
        (x * 3).detach()
    assert [c[0] for c in mode.calls] == [aten.mul.Tensor, aten.detach.default]

    calls = []
    entry = T.LazyTensor.__dict__["__torch_dispatch__"].__func__

    def replaced(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN202
        calls.append(func)
        return entry(cls, func, types, args, kwargs)

    monkeypatch.setattr(T.LazyTensor, "__torch_dispatch__", classmethod(replaced))
    y = x + x
    assert calls == [aten.add.Tensor]
    assert y.cpu().tolist() == [[2.0] * 3] * 2


def test_a_failed_build_warns_once_and_keeps_torchs_way(tmp_path):
    """No compiler (``CXX=false``) in an empty cache: a warning saying why, and ops still record."""
    code = textwrap.dedent(f'''
        import sys, warnings
        sys.path.insert(0, {str(ROOT)!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, xla_dtensor
        from xla_dtensor.core import cxx
        x = torch.ones(3, device=xla_dtensor.device()) * 2.5
        print(cxx.MODULE is None, list(cxx.build_dir().glob("_cxx-*")), x.tolist())
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    ''')
    env = {**os.environ, "CXX": "false", "XLA_DTENSOR_BUILD_DIR": str(tmp_path)}
    env.pop("XLA_DTENSOR_CXX", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, warned = proc.stdout.strip().splitlines()[-2:]
    assert first == "True [] [2.5, 2.5, 2.5]"
    assert "compiling _cxx.cpp failed (exit 1)" in warned and "XLA_DTENSOR_CXX=0" in warned
    assert warned.count("C++ part is not available") == 1


def test_cxx_0_chooses_torchs_way_without_a_warning():
    code = ("import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
            "import torch, xla_dtensor\nfrom xla_dtensor.core import cxx\n"
            "print(cxx.MODULE, cxx.REASON, (torch.ones(2, device=xla_dtensor.device()) + 1).tolist())")
    env = {**os.environ, "XLA_DTENSOR_CXX": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "None XLA_DTENSOR_CXX=0 [2.0, 2.0]"


def test_a_new_build_removes_old_builds_of_this_torch_only(tmp_path, monkeypatch):
    monkeypatch.setenv("XLA_DTENSOR_BUILD_DIR", str(tmp_path))
    out = cxx.target()
    stem, suffix = cxx._stem(), cxx._SUFFIX
    old, recent = tmp_path / f"{stem}-0123456789ab{suffix}", tmp_path / f"{stem}-ba9876543210{suffix}"
    other_torch = tmp_path / f"_cxx-torch0.0.1-{sys.implementation.cache_tag}-x-abi1-0123456789ab{suffix}"
    for path in (out, old, recent, other_torch):
        path.write_bytes(b"")
    os.utime(old, (0, 0))
    os.utime(other_torch, (0, 0))
    cxx._prune(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (out, recent, other_torch))
