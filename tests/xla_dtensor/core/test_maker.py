"""The C++ tensor maker (``core/_maker.cpp``, built by ``core/cxx.py``) against torch's own.

Oracle: ``torch.Tensor._make_wrapper_subclass``, which the maker replaces, called with the
same class and metadata; and torch CPU for the values of a model run with the maker and
without it. The sharded and transformers runs of ``test_native`` (C recorder against the
Python one, which makes its tensors with torch's function) cover it on DP, 2x4 Megatron,
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
from xla_dtensor.core import cxx, native, tensor as T

ROOT = Path(__file__).resolve().parents[3]
needs_maker = pytest.mark.skipif(cxx.MODULE is None, reason=f"the C++ tensor maker is not in use: {cxx.REASON}")

METAS = [
    ((2, 3), torch.float32, (3, 1)),
    ((), torch.float32, ()),
    ((4, 5), torch.bfloat16, (1, 4)),  # transposed
    ((2, 0, 3), torch.int64, (3, 3, 1)),  # a zero-size dimension
    ((3, 2), torch.float16, (4, 2)),  # a strided slice
    ((6,), torch.bool, (1,)),
]


def test_the_dev_install_builds_the_maker():
    """dev.py builds it at setup: CI without it would time the slower path silently."""
    if not native.ON or os.environ.get("XLA_DTENSOR_CXX") == "0":
        pytest.skip("the C recorder or the maker is switched off")
    assert cxx.MODULE is not None, cxx.REASON
    assert cxx.target().exists() and str(cxx.MODULE.__file__) == str(cxx.target())


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


@needs_maker
def test_a_model_trains_alike_with_and_without_the_maker():
    """The same steps recorded with tensors made each way: both equal torch CPU's."""
    def train(dev: torch.device) -> list[float]:
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

    cpu = train(torch.device("cpu"))
    with_maker = train(xla_dtensor.device())
    native.MODULE.configure_maker(None)
    try:
        without = train(xla_dtensor.device())
    finally:
        native.MODULE.configure_maker(cxx.MODULE.MAKE)
    torch.testing.assert_close(torch.tensor(with_maker), torch.tensor(cpu), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(torch.tensor(with_maker), torch.tensor(without), rtol=0, atol=0)


def test_a_failed_build_warns_once_and_keeps_torchs_maker(tmp_path):
    """No compiler (``CXX=false``) in an empty cache: a warning saying why, and ops still record."""
    code = textwrap.dedent(f'''
        import sys, warnings
        sys.path.insert(0, {str(ROOT)!r})
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            import torch, xla_dtensor
        from xla_dtensor.core import cxx
        x = torch.ones(3, device=xla_dtensor.device()) * 2.5
        print(cxx.MODULE is None, list(cxx.cache_dir().glob("_maker-*")), x.tolist())
        print([str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)])
    ''')
    env = {**os.environ, "CXX": "false", "XLA_DTENSOR_CACHE_DIR": str(tmp_path)}
    env.pop("XLA_DTENSOR_CXX", None)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, warned = proc.stdout.strip().splitlines()[-2:]
    assert first == "True [] [2.5, 2.5, 2.5]"
    assert "compiling _maker.cpp failed (exit 1)" in warned and "XLA_DTENSOR_CXX=0" in warned
    assert warned.count("C++ tensor maker is not available") == 1


def test_cxx_0_chooses_torchs_maker_without_a_warning():
    code = ("import warnings; warnings.simplefilter('error', RuntimeWarning)\n"
            "import torch, xla_dtensor\nfrom xla_dtensor.core import cxx\n"
            "print(cxx.MODULE, cxx.REASON, (torch.ones(2, device=xla_dtensor.device()) + 1).tolist())")
    env = {**os.environ, "XLA_DTENSOR_CXX": "0"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "None XLA_DTENSOR_CXX=0 [2.0, 2.0]"
