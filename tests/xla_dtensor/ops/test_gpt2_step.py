"""Every aten call of a tiny GPT-2 training step (forward, backward, clip_grad_norm_, AdamW/SGD foreach,
Adam capturable) has a direct lowering whose output equals torch CPU's."""
from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from tests.xla_dtensor.ops.harness import assert_match, to_jnp
from xla_dtensor.ops import get_lowering, is_random, next_key

SKIP = {"_local_scalar_dense", "_record_function_enter_new", "_record_function_exit"}


class _Check(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.seen: Counter = Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func._schema.name.split("::")[-1] in SKIP or func.namespace != "aten":
            return func(*args, **kwargs)
        jargs, jkwargs = pytree.tree_map(to_jnp, (args, kwargs))
        out = func(*args, **kwargs)
        fn = get_lowering(func)
        assert fn is not None, f"GPT-2 step op without a direct lowering: {func}"
        self.seen[str(func)] += 1
        if is_random(func) or "empty" in str(func):  # unspecified values: shape only
            ours = fn(next_key(), *jargs, **jkwargs) if is_random(func) else fn(*jargs, **jkwargs)
            ref = args[0] if func._schema.name.endswith("_") else out
            assert tuple(ours.shape) == tuple(ref.shape), func
            return out
        ours = fn(*jargs, **jkwargs)
        ref = args[0] if out is None else out
        assert_match(ours, ref, str(func), tol=(1e-4, 1e-5))
        return out


class _Block(nn.Module):
    def __init__(self, d: int = 16, heads: int = 2, dropout: float = 0.1) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.heads, self.dropout = heads, dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class _GPT(nn.Module):
    def __init__(self, vocab: int = 50, d: int = 16, ctx: int = 8) -> None:
        super().__init__()
        self.wte, self.wpe, self.block, self.lnf = nn.Embedding(vocab, d), nn.Embedding(ctx, d), _Block(d), nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]
        x = self.lnf(self.block(self.wte(idx) + self.wpe(torch.arange(0, T, dtype=torch.long))))
        att = (x @ x.transpose(-2, -1)) * 0.25  # the manual masked-softmax attention of nanoGPT
        att = att.masked_fill(torch.tril(torch.ones(T, T)).view(1, T, T) == 0, float("-inf")).softmax(-1)
        logits = self.head(x + att @ x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


@pytest.mark.parametrize("optim", ["adamw", "sgd", "adam_capturable"])
def test_gpt2_step_ops(optim: str, monkeypatch: pytest.MonkeyPatch) -> None:
    torch.manual_seed(0)
    model = _GPT()
    if optim == "adam_capturable":  # the core's PrivateUse1 device takes this path; let CPU take it too
        import torch.optim.adam as adam_mod
        import torch.optim.optimizer as opt_mod
        devices = lambda supports_xla=True: ["cpu", "cuda", "privateuseone"]  # noqa: E731
        monkeypatch.setattr(opt_mod, "_get_capturable_supported_devices", devices)
        monkeypatch.setattr(adam_mod, "_get_capturable_supported_devices", devices, raising=False)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3, foreach=True, capturable=True, amsgrad=True)
    elif optim == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, foreach=True)
    idx = torch.randint(0, 50, (2, 8))
    with _Check() as mode:
        loss = model(idx, idx)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.step()
        opt.zero_grad()
    assert "aten.native_layer_norm_backward.default" in mode.seen and any("_foreach_" in k for k in mode.seen)
