"""Donated buffers go to the update of the tensor that owned them.

Oracle: the device address of each parameter's / optimizer buffer's array before and
after a training step (``unsafe_buffer_pointer``). An in-place update that reuses its
own buffer keeps the address; pairing donated inputs to outputs by shape alone hands
one same-shaped parameter's buffer to another (XLA then copies them in and out).
"""
from __future__ import annotations

import pytest
import torch

import xla_dtensor
from autoshard.models import GPT2, GPT2Config
from xla_dtensor.core import packs
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


def test_lazy_step_updates_its_packs_in_their_own_buffers() -> None:
    """Packed state: each step writes the new pack over the old one (donated), in place."""
    model, opt, x = _setup()
    for _ in range(2):
        _step(model, opt, x)
        xla_dtensor.sync()
    found = {id(value_of(t).raw): value_of(t).raw for t in _state(model, opt)}
    assert all(type(p) is packs.Pack for p in found.values()), "every state tensor is packed"
    before = {p.layout: p.array.unsafe_buffer_pointer() for p in found.values()}
    _step(model, opt, x)
    xla_dtensor.sync()
    xla_dtensor.wait()
    now = {id(value_of(t).raw): value_of(t).raw for t in _state(model, opt)}
    after = {p.layout: p.array.unsafe_buffer_pointer() for p in now.values()}
    assert before and after == before


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
