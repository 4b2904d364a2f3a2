"""Donated buffers go to the update of the tensor that owned them.

Oracle: the device address of each parameter's / optimizer buffer's array before and
after a training step (``unsafe_buffer_pointer``). An in-place update that reuses its
own buffer keeps the address; pairing donated inputs to outputs by shape alone hands
one same-shaped parameter's buffer to another (XLA then copies them in and out).
Packed state is never donated: the oracle there is the step's optimized HLO (no copy of a
pack's shape) and its memory analysis (no pack's buffer aliased).
"""
from __future__ import annotations

import re

import pytest
import torch

import xla_dtensor
from autoshard.models import GPT2, GPT2Config
from xla_dtensor.core import executor, packs
from xla_dtensor.core.executor import materialize
from xla_dtensor.core.tensor import value_of


def _pointers(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, int]:
    out = {}
    for i, p in enumerate(model.parameters()):
        out[f"param{i}"] = materialize(p).unsafe_buffer_pointer()
        for k, v in opt.state.get(p, {}).items():
            if isinstance(v, torch.Tensor) and v.dim() > 0:
                out[f"param{i}.{k}"] = materialize(v).unsafe_buffer_pointer()
    return out


def _setup() -> tuple:
    # NOTE: GPT-2's leaves are met in a graph order unlike its parameter order (a stack of
    # Linear layers happens to list them alike, and passed without the pairing too)
    torch.manual_seed(0)
    dev = xla_dtensor.device()
    model = GPT2(GPT2Config(vocab=32, n_positions=8, n_embd=16, n_layer=1, n_head=2)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 32, (2, 8)).to(dev)
    return model, opt, x


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> torch.Tensor:
    loss = model(x, x)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


@pytest.fixture
def unpacked():
    """State as one array per tensor (packing off: xla_dtensor/core/packs.py), as a tensor over
    ``packs.MAX_BYTES`` always is."""
    xla_dtensor.config.pack_state = False
    yield
    xla_dtensor.config.pack_state = True


def test_lazy_step_updates_each_state_tensor_in_its_own_buffer(unpacked: None) -> None:
    model, opt, x = _setup()
    for _ in range(2):  # the second step creates no new state: from here on every buffer is donated
        _step(model, opt, x)
        xla_dtensor.sync()
    before = _pointers(model, opt)
    _step(model, opt, x)
    xla_dtensor.sync()
    xla_dtensor.wait()
    after = _pointers(model, opt)
    assert len(before) > 3 * len(list(model.parameters())) - 1  # parameters, exp_avg, exp_avg_sq
    moved = {k: (before[k], after[k]) for k in before if before[k] != after[k]}
    assert not moved, f"state tensors updated outside their own buffers: {sorted(moved)}"


def test_lazy_step_writes_new_packs_and_copies_no_old_one() -> None:
    """Packed state: each step writes its packs into new buffers (none donated). Written over the donated old pack,
    XLA copied the whole pack twice a step (the optimized HLO's ``copy`` of the pack's shape) to keep the old
    members' reads before the writes."""
    model, opt, x = _setup()
    for _ in range(3):
        _step(model, opt, x)
        xla_dtensor.sync()
    xla_dtensor.wait()
    found = {id(value_of(t).raw): value_of(t).raw for t in _state(model, opt)}
    assert all(type(p) is packs.Pack for p in found.values()), "every state tensor is packed"
    hlo = executor.last_executable().as_text()
    shapes = {f"[{p.layout.rows},{p.layout.columns}]" for p in found.values()}
    copies = [line for line in hlo.splitlines() if re.search(r"= \S+ copy\(", line)
              and any(s in line.split("copy(")[0] for s in shapes)]
    assert shapes and not copies, copies[:3]
    assert executor.last_executable().memory_analysis().alias_size_in_bytes < min(
        p.array.nbytes for p in found.values())  # no pack's buffer aliased by an output


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = list(model.parameters())
    for p in model.parameters():
        out += [v for v in opt.state[p].values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return out


def test_compiled_step_updates_each_state_tensor_in_its_own_buffer() -> None:
    model, opt, x = _setup()
    step = xla_dtensor.compile(_step)
    for _ in range(3):
        step(model, opt, x)
    before = _pointers(model, opt)
    step(model, opt, x)
    xla_dtensor.wait()
    after = _pointers(model, opt)
    moved = {k for k in before if before[k] != after[k]}
    assert not moved, f"state tensors updated outside their own buffers: {sorted(moved)}"
