"""The GPT-2 of ``gpt2.py`` written directly in JAX (same math, weights copied from torch).

``params_from_torch(model)`` copies a torch ``GPT2``'s weights; ``loss_fn(params, idx,
targets, cfg)`` is the same forward (tied embeddings, pre-LN blocks, tanh GELU, causal
SDPA, mean cross-entropy); ``adamw_step`` is torch's AdamW update (decoupled weight
decay, bias correction). ``make_train_step(cfg, lr, wd)`` returns a jitted
``(params, state, idx, targets) -> (params, state, loss)`` with donated params/state;
``make_packed_train_step`` the same step over flat parameter and moment buffers.

Example:
    >>> import torch
    >>> from benchmarks.models import GPT2, GPT2Config
    >>> cfg = GPT2Config(vocab=64, n_positions=16, n_embd=32, n_layer=1, n_head=4)
    >>> p = params_from_torch(GPT2(cfg))
    >>> sorted(p)[:2]
    ['h', 'ln_f']
"""
from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp


def _np(t: Any) -> jnp.ndarray:
    return jnp.asarray(t.detach().cpu().numpy())


def params_from_torch(model: Any) -> dict:
    """The torch model's weights as a JAX pytree (``lm_head`` tied to ``wte``)."""
    def lin(m: Any) -> dict:
        return {"w": _np(m.weight), "b": _np(m.bias)}

    def ln(m: Any) -> dict:
        return {"g": _np(m.weight), "b": _np(m.bias)}
    blocks = [{"ln_1": ln(b.ln_1), "ln_2": ln(b.ln_2), "q": lin(b.attn.q_proj), "k": lin(b.attn.k_proj),
               "v": lin(b.attn.v_proj), "o": lin(b.attn.c_proj), "fc": lin(b.mlp.c_fc),
               "proj": lin(b.mlp.c_proj)} for b in model.h]
    return {"wte": _np(model.wte.weight), "wpe": _np(model.wpe.weight), "h": blocks, "ln_f": ln(model.ln_f)}


def _layer_norm(x: jnp.ndarray, p: dict) -> jnp.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]


def _linear(x: jnp.ndarray, p: dict) -> jnp.ndarray:
    return x @ p["w"].T + p["b"]


def _attention(x: jnp.ndarray, p: dict, n_head: int, attention: str = "math") -> jnp.ndarray:
    b, t, c = x.shape
    if attention != "math":  # jax's fused API: "xla" or "cudnn" (BTNH layout)
        q, k, v = (_linear(x, p[n]).reshape(b, t, n_head, c // n_head) for n in ("q", "k", "v"))
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=attention)
        return _linear(y.reshape(b, t, c), p["o"])
    heads = lambda y: y.reshape(b, t, n_head, c // n_head).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = heads(_linear(x, p["q"])), heads(_linear(x, p["k"])), heads(_linear(x, p["v"]))
    # NOTE: a Python float, not np.sqrt: with x64 on (xla_dtensor enables it) a numpy float64 is not
    # weakly typed and would promote the scores, and then the whole residual stream, to float64.
    s = q @ k.transpose(0, 1, 3, 2) * (1.0 / math.sqrt(c // n_head))
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    y = jax.nn.softmax(s, axis=-1) @ v
    return _linear(y.transpose(0, 2, 1, 3).reshape(b, t, c), p["o"])


def loss_fn(params: dict, idx: jnp.ndarray, targets: jnp.ndarray, n_head: int, attention: str = "math") -> jnp.ndarray:
    """Mean cross-entropy of the model on ``idx`` -> ``targets``.

    ``attention``: ``"math"`` (einsum, mask, softmax, einsum), or the ``implementation`` of
    ``jax.nn.dot_product_attention`` (``"xla"``, ``"cudnn"``).
    """
    t = idx.shape[1]
    x = params["wte"][idx] + params["wpe"][jnp.arange(t)]
    for blk in params["h"]:
        x = x + _attention(_layer_norm(x, blk["ln_1"]), blk, n_head, attention)
        h = jax.nn.gelu(_linear(_layer_norm(x, blk["ln_2"]), blk["fc"]), approximate=True)
        x = x + _linear(h, blk["proj"])
    logits = _layer_norm(x, params["ln_f"]) @ params["wte"].T
    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.take_along_axis(logp, targets[..., None], axis=-1).mean()


def adamw_init(params: dict, per_param_steps: bool = False) -> dict:
    """AdamW state: both moments, and one step count (or, like torch, one per parameter)."""
    def zero(_: Any = None) -> jnp.ndarray:  # a buffer of its own each (they are donated)
        return jnp.zeros((), jnp.float32)
    return {"m": jax.tree_util.tree_map(jnp.zeros_like, params), "v": jax.tree_util.tree_map(jnp.zeros_like, params),
            "step": jax.tree_util.tree_map(zero, params) if per_param_steps else zero()}


def make_train_step(n_head: int, lr: float = 1e-3, wd: float = 0.01, b1: float = 0.9, b2: float = 0.999,
                    eps: float = 1e-8, jit: bool = True) -> Any:
    """A jitted AdamW train step, torch's update rule, params and state donated.

    The state's step is one count, or one per parameter (:func:`adamw_init`), as torch's
    AdamW keeps it: then every parameter computes its own bias corrections. ``jit=False``
    returns the plain function: called as is, JAX runs it op by op (its eager mode).
    """
    def step(params: dict, state: dict, idx: jnp.ndarray, targets: jnp.ndarray) -> tuple:
        loss, g = jax.value_and_grad(loss_fn)(params, idx, targets, n_head)
        n = jax.tree_util.tree_map(lambda s: s + 1, state["step"])
        counts = n if isinstance(n, dict) else jax.tree_util.tree_map(lambda _: n, params)
        m = jax.tree_util.tree_map(lambda m_, g_: b1 * m_ + (1 - b1) * g_, state["m"], g)
        v = jax.tree_util.tree_map(lambda v_, g_: b2 * v_ + (1 - b2) * g_ * g_, state["v"], g)

        def upd(p: jnp.ndarray, m_: jnp.ndarray, v_: jnp.ndarray, c: jnp.ndarray) -> jnp.ndarray:
            bc1, bc2 = 1 - b1 ** c, 1 - b2 ** c
            p = p * (1 - lr * wd)
            return p - lr / bc1 * m_ / (jnp.sqrt(v_) / jnp.sqrt(bc2) + eps)
        return jax.tree_util.tree_map(upd, params, m, v, counts), {"m": m, "v": v, "step": n}, loss
    if not jit:
        return step
    # NOTE: the same buffers as compile mode's program: params and optimizer state donated, batch not.
    return jax.jit(step, donate_argnums=(0, 1))


def make_packed_train_step(n_head: int, params: dict, lr: float = 1e-3, wd: float = 0.01) -> tuple[Any, list]:
    """:func:`make_train_step` with the parameters and both moments each packed into one flat
    buffer: a jitted ``(P, M, V, step, idx, targets) -> (P, M, V, step, loss)`` (all but the
    batch donated), and its first inputs from ``params``.

    The program slices and reshapes the flat buffers, runs the same step, and concatenates
    the results: four state buffers instead of three per parameter, the same math.
    """
    from jax.flatten_util import ravel_pytree
    flat, unravel = ravel_pytree(params)
    step = make_train_step(n_head, lr=lr, wd=wd, jit=False)

    def packed(P: jnp.ndarray, M: jnp.ndarray, V: jnp.ndarray, n: jnp.ndarray, idx: jnp.ndarray,
               targets: jnp.ndarray) -> tuple:
        p, s, loss = step(unravel(P), {"m": unravel(M), "v": unravel(V), "step": n}, idx, targets)
        return ravel_pytree(p)[0], ravel_pytree(s["m"])[0], ravel_pytree(s["v"])[0], s["step"], loss
    first = [jnp.array(flat), jnp.zeros_like(flat), jnp.zeros_like(flat), jnp.zeros((), jnp.float32)]
    return jax.jit(packed, donate_argnums=(0, 1, 2, 3)), first
