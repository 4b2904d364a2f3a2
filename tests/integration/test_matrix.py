"""The integration matrix: third-party models, unmodified, trained in every mode against torch CPU.

Each (model, mode) runs :data:`STEPS` AdamW steps from the same seeded weights and
batches as torch CPU eager (the oracle), compares the losses (rtol 1e-3) and asserts
that no program compiles after the warm-up steps; under AUTO, the plan must shard the batch
or some parameter (issue 26: never "replicate everything" where data parallelism is
feasible) and leave no op without a sharding rule. Models and modes:
``benchmarks/models/zoo.py`` and ``benchmarks/models/zoo_train.py``. With
``XLA_DTENSOR_MATRIX_JSON=path`` set, every outcome is written there (the source of
``docs/models.md``: ``python benchmarks/models_matrix.py``).

Without that variable, a second process (``_matrix_worker.py``) starts when the session's collection
ends and trains cells from the end of the selection, at low CPU priority on the core the (single-threaded)
test process leaves idle; the matrix runs last in the session (``conftest.py``), and this process trains
cells from the start until it meets one the worker has taken. Each cell's test makes the same
assertions on the outcome either way.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import xla_dtensor  # noqa: F401  (the jax device registers before any CPU backward)
from benchmarks.models.zoo import ZOO, torchvision_unavailable
from benchmarks.models.zoo_train import MODES, train, unsupported

from tests import _parallel
from tests._parallel import claim

from ._matrix_worker import key

STEPS = 3
HERE = Path(__file__).resolve().parent
_REF: dict[str, list[float]] = {}


def _reference(name: str) -> list[float]:
    if name not in _REF:
        _REF[name] = train(ZOO[name], "cpu", STEPS).losses
    return _REF[name]


# NOTE: the default run keeps under 20 minutes on a 2-core machine; these cells run with ``-m slow``
# (benchmarks/models_matrix.py runs every cell). Each path stays covered in the default tier:
# - auto-1x8 cells repeat the same model's AUTO 2x4 cell on a 1-D mesh; timm-vit and titan-llama keep the
#   matrix's 1-D AUTO cells;
# - HF GPT-2, Llama (KV cache on) and Mixtral train under AUTO on 2x4 (and GPT-2 on 1x8) in
#   tests/xla_dtensor/auto/test_hf_auto.py::test_auto_shards_and_trains_like_cpu (losses against torch CPU,
#   the same plan-quality bar: no op without a rule, not all replicated), so their auto cells run here with
#   -m slow; no compile after the warm-up under AUTO stays checked by the other models' auto-2x4 cells;
# - hf-llama-cache is hf-llama with use_cache=True: its layers train in every hf-llama cell, a forward that
#   returns KV-cache tensors in every hf-gpt-neo and hf-t5 cell (use_cache=True), and the same Llama with
#   its cache under AUTO in test_hf_auto.py [llama-2x4]; its single-device cell stays here.
SLOW = {("timm-resnet18", "auto-1x8"), ("hf-mixtral", "auto-1x8"), ("hf-t5", "auto-1x8"),
        ("hf-gpt2", "auto-1x8"), ("hf-llama", "auto-1x8"), ("hf-gpt-neo", "auto-1x8"), ("hf-bert", "auto-1x8"),
        ("hf-gpt2", "auto-2x4"), ("hf-llama", "auto-2x4"), ("hf-mixtral", "auto-2x4"),
        *(("hf-llama-cache", m) for m in ("compile", "auto-1x8", "auto-2x4", "fsdp", "tp", "tp-sp"))}


def _skip_reason(name: str, mode: str) -> str | None:
    zm = ZOO[name]
    if "timm" in zm.needs and torchvision_unavailable():
        return torchvision_unavailable()
    return unsupported(zm, mode)


class _Worker:
    """The second process and the claim files it and this process share (see the module doc)."""

    def __init__(self, cells: list[tuple[str, str]], tmp: Path) -> None:
        self.claims, self.results, self.log = tmp / "claims", tmp / "results", tmp / "worker.log"
        self.claims.mkdir()
        self.results.mkdir()
        env = _parallel.child_env(dict(os.environ, PYTHONPATH=str(HERE.parents[1])), __name__)
        with open(self.log, "w") as log:
            # niceness 19: below the other background jobs too (their modules come before this one)
            self.proc = _parallel.popen(
                [sys.executable, str(HERE / "_matrix_worker.py"), str(self.claims), str(self.results),
                 json.dumps(cells), str(STEPS)], 19, stdout=log, stderr=subprocess.STDOUT, cwd=HERE.parents[1],
                env=env)

    def outcome(self, name: str, mode: str) -> dict | None:
        """None: this process trains the cell; else the worker's outcome (waited for)."""
        if claim(self.claims, key(name, mode)):
            return None
        path, t0 = self.results / f"{key(name, mode)}.json", time.monotonic()
        while not path.exists():
            if self.proc.poll() is not None and not path.exists():
                pytest.fail(f"the matrix worker exited ({self.proc.returncode}) before {name} {mode}:\n"
                            f"{self.log.read_text()[-4000:]}")
            assert time.monotonic() - t0 < 1800, f"the matrix worker took over 30 minutes on {name} {mode}"
            time.sleep(0.05)
        out = json.loads(path.read_text())
        if "error" in out:
            pytest.fail(f"{name} {mode} (in the matrix worker):\n{out['error']}")
        return out

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


_STARTED: list[_Worker] = []


def start_early(session: pytest.Session) -> None:
    """The second process, for the cells this session runs (none for a few cells or a JSON report);
    called when collection ends (tests/conftest.py)."""
    cells = []
    for item in session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.module is sys.modules[__name__] and "name" in params \
                and _skip_reason(params["name"], params["mode"]) is None:
            cells.append((params["name"], params["mode"]))
    if os.environ.get("XLA_DTENSOR_MATRIX_JSON") or len(cells) < 4:  # the report times every cell here
        return
    _STARTED.append(_Worker(cells, _parallel.scratch("matrix_worker")))


@pytest.fixture(scope="module")
def worker():
    """The second process :func:`start_early` started, if it did (from now on this process waits on it)."""
    if _STARTED:
        _parallel.hurry([_STARTED[0].proc])
    yield _STARTED[0] if _STARTED else None
    while _STARTED:
        _STARTED.pop().close()


@pytest.mark.parametrize("name,mode", [
    pytest.param(n, m, id=f"{n}-{m}", marks=[pytest.mark.slow] if (n, m) in SLOW else []) for n in ZOO for m in MODES])
def test_trains_like_torch_cpu(name: str, mode: str, matrix_record, worker, request) -> None:
    why = _skip_reason(name, mode)
    if why is not None:
        pytest.skip(why)
    out = worker.outcome(name, mode) if worker is not None else None
    if out is None:
        ref = _reference(name)
        res = train(ZOO[name], mode, STEPS)
        losses, compiles, step_ms, info = res.losses, res.compiles_after_warmup, res.step_ms, res.info
    else:
        request.node.trained_elsewhere = True  # nothing compiled here: no executables to release
        ref, losses, compiles, step_ms, info = (out[k] for k in ("ref", "losses", "compiles_after_warmup",
                                                                 "step_ms", "info"))
    err = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
    matrix_record(rel_err=err, compiles_after_warmup=compiles, step_ms=step_ms, **info)
    assert all(math.isfinite(x) for x in losses), losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(ref), rtol=1e-3, atol=0)
    assert compiles == 0, f"{compiles} compiles after step {2}"
    if mode.startswith("auto"):
        _assert_plan_parallelizes(info["plan"])


def _assert_plan_parallelizes(plan: dict) -> None:
    """Issue 26's plan-quality bar: every op has a rule, and with data parallelism feasible on a
    multi-device mesh the plan shards the batch or some parameter (the guard's report otherwise)."""
    assert plan["unknown_ops"] == [], f"ops without a sharding rule (run whole, inputs gathered): {plan['unknown_ops']}"
    assert not (plan["all_replicated"] and plan["dp_feasible"]), f"AUTO replicates everything: {plan['guard']}"
