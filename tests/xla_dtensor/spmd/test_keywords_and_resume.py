"""``shard_model`` splits keyword tensor inputs too: an HF model called as ``model(input_ids=..., labels=...)``."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.models import torchvision_shim
from mesh import Mesh
from xla_dtensor import spmd
from xla_dtensor.fsdp import shard_model


@pytest.fixture(scope="module")
def llama():
    torchvision_shim.install()
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))


def test_keyword_inputs_of_an_hf_model_are_split(dev, llama):
    import copy
    ref = copy.deepcopy(llama)
    m = shard_model(copy.deepcopy(llama), Mesh(range(8), (8,), ("fsdp",)))
    seen = {}
    m.model.embed_tokens.register_forward_pre_hook(lambda mod, a: seen.setdefault("ids", a[0]))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (8, 16), generator=g)
    out = m(input_ids=ids.to(dev), labels=ids.to(dev))
    spec = spmd.get_spec(seen["ids"]).to_partition_spec()
    assert spec[0] == "fsdp", spec
    shards = seen["ids"]._storage.value.data.addressable_shards
    assert {tuple(s.data.shape) for s in shards} == {(1, 16)}
    want = ref(input_ids=ids, labels=ids).loss
    torch.testing.assert_close(out.loss.cpu(), want, rtol=1e-4, atol=1e-5)


def test_device_tensor_lr_survives_load_state_dict(dev):
    import xla_dtensor
    p = torch.nn.Parameter(torch.ones(4, device=dev))
    opt = torch.optim.AdamW([p], lr=torch.tensor(0.01, device=dev))
    p.grad = torch.ones(4, device=dev)
    opt.step()
    sd = opt.state_dict()
    opt2 = torch.optim.AdamW([p], lr=torch.tensor(0.5, device=dev))
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["lr"].item() == pytest.approx(0.01)
    xla_dtensor.sync()


def test_deepcopy_of_a_module_on_the_device_keeps_parameters(dev):
    import copy
    m = torch.nn.Linear(4, 4).to(dev)
    m2 = copy.deepcopy(m)
    assert isinstance(m2.weight, torch.nn.Parameter) and m2.weight.requires_grad
    assert [n for n, _ in m2.named_parameters()] == ["weight", "bias"]
    torch.testing.assert_close(m2.weight.cpu(), m.weight.cpu())


def test_resume_compiles_few_programs_and_keeps_a_device_lr(dev, tmp_path):
    """dcp.save of an FSDP model + AdamW (device-tensor lr), restore into a fresh pair: <= 8 compiles."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import xla_dtensor
    from xla_dtensor import metrics

    def make(lr):
        torch.manual_seed(0)
        # 3 layers: 6 parameters and 12 AdamW moments (and step counters), so a compile per restored tensor
        # still fails the bound of 8; 6 layers doubled dcp.save's time (it materializes each tensor: ~14 s)
        m = shard_model(torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)]),
                        Mesh(range(8), (8,), ("fsdp",)))
        return m, torch.optim.AdamW(m.parameters(), lr=torch.tensor(lr, device=dev))

    def train(m, opt, n):
        for _ in range(n):
            m(torch.randn(8, 16).to(dev)).sum().backward()
            opt.step()
            opt.zero_grad()

    m, opt = make(1e-2)
    train(m, opt, 2)
    msd, osd = get_state_dict(m, opt)
    dcp.save({"m": msd, "o": osd}, checkpoint_id=str(tmp_path))
    m2, opt2 = make(0.5)
    train(m2, opt2, 1)
    xla_dtensor.sync()
    before = metrics.snapshot()
    msd, osd = get_state_dict(m2, opt2)
    sd = {"m": msd, "o": osd}
    dcp.load(sd, checkpoint_id=str(tmp_path))
    set_state_dict(m2, opt2, model_state_dict=sd["m"], optim_state_dict=sd["o"])
    xla_dtensor.sync()
    assert metrics.diff(before)["compiles"] <= 8, metrics.diff(before)
    lr = opt2.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor) and lr.device.type == dev.type and lr.item() == pytest.approx(1e-2)
    for a, b in zip(m.parameters(), m2.parameters()):
        torch.testing.assert_close(a.cpu(), b.cpu())


def _run_loop(mode: str, phase: str, path) -> dict:
    import json
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "_llama_resume.py")
    proc = subprocess.run([sys.executable, script, mode, phase, str(path)], capture_output=True, text=True,
                          timeout=600)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp", "tp"])
def test_hf_llama_loop_resumes_in_a_new_process_with_few_compiles(tmp_path, mode):
    """Issue 41, item 6: the realistic loop (AdamW, warmup + cosine, clipping, accumulation, activation
    checkpointing), DCP save after step 10, restore in a new process: <= 8 XLA compiles during the restore
    (model + optimizer + schedule; ~84 tensors), and steps 10-12 after it equal a straight 13-step torch CPU
    run (rel 1e-3). The issue saw 63 compiles for this restore; measured 1 (FSDP 8 devices, TP 2x4)."""
    want = _run_loop("cpu", "straight", tmp_path / "unused")["losses"]
    first = _run_loop(mode, "train", tmp_path / "ckpt")
    np.testing.assert_allclose(first["losses"], want[:10], rtol=1e-3)
    resumed = _run_loop(mode, "resume", tmp_path / "ckpt")
    r = resumed["restore"]
    print(f"\n{mode}: restore of {r['tensors']} tensors: {r['compiles']} compiles "
          f"({r['persistent_cache_hits']} persistent-cache hits), {r['seconds']} s")
    assert r["compiles"] + r["persistent_cache_hits"] <= 8, r
    assert r["tensors"] >= 60, r  # the whole model and the AdamW moments were restored
    np.testing.assert_allclose(resumed["losses"], want[10:], rtol=1e-3)
