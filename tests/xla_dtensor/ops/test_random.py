"""Random lowerings: torch's output shapes/dtypes, distribution moments and ranges, seeding.

Bit-equality with torch's CPU generator is not a goal; torch's own op on the same
arguments is the oracle for shape and dtype, and known moments for the values.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.xla_dtensor.ops.harness import T, to_jnp
from xla_dtensor.ops import get_lowering, is_random
from xla_dtensor.ops import random as rnd
from xla_dtensor.ops.dtypes import to_torch

aten = torch.ops.aten
N = 20000


def run(op: object, *args: object, **kwargs: object) -> np.ndarray:
    """Our sample, after asserting torch's shape and dtype for the same call."""
    assert is_random(op)
    ref = op(*args, **kwargs)
    ours = get_lowering(op)(rnd.next_key(), *[to_jnp(a) for a in args], **kwargs)
    for o, r in zip(ours if isinstance(ref, tuple) else [ours], ref if isinstance(ref, tuple) else [ref]):
        assert tuple(o.shape) == tuple(r.shape) and to_torch(o.dtype) == r.dtype, (op, o.shape, o.dtype, r.shape, r.dtype)
    return ours


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.bfloat16])
def test_uniform_and_normal(dtype: torch.dtype | None) -> None:
    kw = {} if dtype is None else {"dtype": dtype}
    u = np.asarray(run(aten.rand.default, [N], **kw), dtype=np.float64)
    assert u.min() >= 0 and u.max() <= 1 and abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    z = np.asarray(run(aten.randn.default, [N], **kw), dtype=np.float64)
    assert abs(z.mean()) < 0.03 and abs(z.std() - 1) < 0.03
    x = T(N // 10, 10)
    u2 = np.asarray(run(aten.uniform.default, x, -2.0, 4.0))
    assert u2.min() >= -2 and u2.max() < 4 and abs(u2.mean() - 1) < 0.06
    n2 = np.asarray(run(aten.normal_functional.default, x, 3.0, 0.5))
    assert abs(n2.mean() - 3) < 0.02 and abs(n2.std() - 0.5) < 0.02
    n3 = np.asarray(run(aten.normal.Tensor_float, torch.full((N,), -1.0), 2.0))
    assert abs(n3.mean() + 1) < 0.06 and abs(n3.std() - 2) < 0.06
    n4 = np.asarray(run(aten.normal.float_float, 1.0, 2.0, [N]))
    assert abs(n4.mean() - 1) < 0.06
    run(aten.rand_like.default, T(3, 2, dtype=torch.bfloat16))
    run(aten.randn_like.default, T(3, 2), dtype=torch.float64)


def test_integers_bernoulli_exponential() -> None:
    r = np.asarray(run(aten.randint.low, -3, 5, [N]))
    assert r.min() == -3 and r.max() == 4 and set(np.unique(r)) == set(range(-3, 5))
    run(aten.randint.default, 10, [2, 3], dtype=torch.int32)
    run(aten.randint_like.default, T(4, dtype=torch.int64), 7)
    bern = np.asarray(run(aten.bernoulli.p, T(N), 0.3))
    assert set(np.unique(bern)) <= {0.0, 1.0} and abs(bern.mean() - 0.3) < 0.015
    probs = torch.rand(N)
    b2 = np.asarray(run(aten.bernoulli.default, probs))
    assert abs(b2.mean() - probs.mean().item()) < 0.015
    assert get_lowering(aten.bernoulli_.float) is get_lowering(aten.bernoulli.p) and is_random(aten.bernoulli_.float)
    e = np.asarray(run(aten.exponential.default, T(N), 2.0))
    assert e.min() >= 0 and abs(e.mean() - 0.5) < 0.02
    rr = np.asarray(run(getattr(aten.random, "from"), T(N), 2, 6))
    assert set(np.unique(rr)) == {2.0, 3.0, 4.0, 5.0}


def test_permutations_multinomial_dropout() -> None:
    p = np.asarray(run(aten.randperm.default, 50))
    assert sorted(p.tolist()) == list(range(50))
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.25, 0.25, 0.25, 0.25]])
    m = np.asarray(run(aten.multinomial.default, probs, 3, False))
    assert all(len(set(row)) == 3 for row in m) and 1 not in m[0]
    mr = np.asarray(run(aten.multinomial.default, probs[:1].expand(1, 4).contiguous(), N, True))[0]
    assert abs((mr == 2).mean() - 0.6) < 0.02 and (mr == 1).sum() == 0
    x = T(N // 10, 10, low=1, high=2)
    out, mask = run(aten.native_dropout.default, x, 0.25, True)
    out, mask, xv = np.asarray(out), np.asarray(mask), x.numpy()
    assert abs(mask.mean() - 0.75) < 0.015
    np.testing.assert_allclose(out, np.where(mask, xv / 0.75, 0), rtol=1e-6)
    out_eval, mask_eval = run(aten.native_dropout.default, x, 0.25, False)
    np.testing.assert_array_equal(np.asarray(out_eval), xv)


def test_seed_api() -> None:
    draw = get_lowering(aten.randn.default)
    rnd.manual_seed(123)
    a = [np.asarray(draw(rnd.next_key(), [4])) for _ in range(2)]
    state = rnd.get_rng_state()
    c = np.asarray(draw(rnd.next_key(), [4]))
    rnd.manual_seed(123)
    b = [np.asarray(draw(rnd.next_key(), [4])) for _ in range(2)]
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.array_equal(a[0], a[1])
    rnd.set_rng_state(state)
    np.testing.assert_array_equal(np.asarray(draw(rnd.next_key(), [4])), c)
    assert rnd.initial_seed() == 123
    with pytest.raises(TypeError, match="seed must be an int"):
        rnd.Generator().manual_seed("7")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="16 bytes"):
        rnd.set_rng_state(torch.zeros(3, dtype=torch.uint8))
