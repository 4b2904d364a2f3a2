"""The integration matrix: third-party models, unmodified, trained in every mode against torch CPU.

Each (model, mode) runs :data:`STEPS` AdamW steps from the same seeded weights and
batches as torch CPU eager (the oracle), compares the losses (rtol 1e-3) and asserts
that no program compiles after the warm-up steps; under AUTO, the plan must shard the batch
or some parameter (issue 26: never "replicate everything" where data parallelism is
feasible) and leave no op without a sharding rule. Models and modes:
``benchmarks/models/zoo.py`` and ``benchmarks/models/zoo_train.py``. With
``XLA_DTENSOR_MATRIX_JSON=path`` set, every outcome is written there (the source of
``docs/models.md``: ``python benchmarks/models_matrix.py``).
"""
from __future__ import annotations

import math

import pytest
import torch

import xla_dtensor  # noqa: F401  (the jax device registers before any CPU backward)
from benchmarks.models.zoo import ZOO, torchvision_unavailable
from benchmarks.models.zoo_train import MODES, train, unsupported

STEPS = 3
_REF: dict[str, list[float]] = {}


def _reference(name: str) -> list[float]:
    if name not in _REF:
        _REF[name] = train(ZOO[name], "cpu", STEPS).losses
    return _REF[name]


# NOTE: the default run keeps under 20 minutes on a 2-core machine; these cells repeat the same
# model's AUTO 2x4 cell on a 1-D mesh and run with ``-m slow`` (benchmarks/models_matrix.py runs every cell)
SLOW = {("timm-resnet18", "auto-1x8"), ("hf-mixtral", "auto-1x8"), ("hf-t5", "auto-1x8")}


@pytest.mark.parametrize("name,mode", [
    pytest.param(n, m, id=f"{n}-{m}", marks=[pytest.mark.slow] if (n, m) in SLOW else []) for n in ZOO for m in MODES])
def test_trains_like_torch_cpu(name: str, mode: str, matrix_record) -> None:
    zm = ZOO[name]
    if "timm" in zm.needs and torchvision_unavailable():
        pytest.skip(torchvision_unavailable())
    why = unsupported(zm, mode)
    if why is not None:
        pytest.skip(why)
    ref = _reference(name)
    res = train(zm, mode, STEPS)
    err = max(abs(a - b) / abs(b) for a, b in zip(res.losses, ref))
    matrix_record(rel_err=err, compiles_after_warmup=res.compiles_after_warmup, step_ms=res.step_ms, **res.info)
    assert all(math.isfinite(x) for x in res.losses), res.losses
    torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(ref), rtol=1e-3, atol=0)
    assert res.compiles_after_warmup == 0, f"{res.compiles_after_warmup} compiles after step {2}"
    if mode.startswith("auto"):
        _assert_plan_parallelizes(res.info["plan"])


def _assert_plan_parallelizes(plan: dict) -> None:
    """Issue 26's plan-quality bar: every op has a rule, and with data parallelism feasible on a
    multi-device mesh the plan shards the batch or some parameter (the guard's report otherwise)."""
    assert plan["unknown_ops"] == [], f"ops without a sharding rule (run whole, inputs gathered): {plan['unknown_ops']}"
    assert not (plan["all_replicated"] and plan["dp_feasible"]), f"AUTO replicates everything: {plan['guard']}"
