"""The pure-JAX GPT-2 twin used as the speed baseline computes what torch computes, in float32."""
from __future__ import annotations

import copy
import re

import jax
import jax.numpy as jnp
import pytest
import torch

import xla_dtensor  # noqa: F401  (turns on jax x64, as in the benchmark)

from benchmarks.models import gpt2_jax

from ._models import adamw, batches, cpu_losses, tiny_gpt2


@pytest.mark.parametrize("per_param_steps", [False, True])
def test_jax_twin_train_steps_match_torch_cpu_in_float32(per_param_steps):
    model, bs = tiny_gpt2(), batches(3, seed=11)
    ref = cpu_losses(copy.deepcopy(model), bs, lambda p: adamw(p))
    params = gpt2_jax.params_from_torch(model)
    state = gpt2_jax.adamw_init(params, per_param_steps)
    assert len(jax.tree_util.tree_leaves(state["step"])) == (len(list(model.parameters())) if per_param_steps else 1)
    step = gpt2_jax.make_train_step(model.cfg.n_head, lr=3e-3, wd=0.1)
    got = []
    for x, y in bs:
        params, state, loss = step(params, state, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        assert loss.dtype == jnp.float32
        got.append(float(loss))
    # no float64 array in the program (x64 is on: a stray numpy scalar would promote the activations;
    # weakly typed f64 scalar literals such as -inf are converted and harmless)
    hlo = step.lower(params, state, jnp.asarray(bs[0][0].numpy()), jnp.asarray(bs[0][1].numpy())).as_text()
    assert not re.findall(r"tensor<\d+(?:x\d+)*xf64>", hlo)
    assert all(leaf.dtype == jnp.float32 for leaf in jax.tree_util.tree_leaves(params))
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)


def test_packed_twin_matches_torch_cpu_and_passes_four_state_buffers():
    model, bs = tiny_gpt2(), batches(3, seed=12)
    ref = cpu_losses(copy.deepcopy(model), bs, lambda p: adamw(p))
    n_params = sum(p.numel() for p in model.parameters())
    step, state = gpt2_jax.make_packed_train_step(model.cfg.n_head, gpt2_jax.params_from_torch(model),
                                                  lr=3e-3, wd=0.1)
    assert [s.shape for s in state] == [(n_params,)] * 3 + [()]
    got = []
    for x, y in bs:
        *state, loss = step(*state, jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        got.append(float(loss))
    assert all(s.dtype == jnp.float32 for s in state)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=0)
