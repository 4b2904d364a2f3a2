"""AUTO with a disk plan cache whose entry does not fit (issue 41, item 2): re-solved with a warning, and the
model trains like torch CPU eager (before: a 5-entry spec raised UnknownAxisError)."""
from __future__ import annotations

import json
import warnings

import pytest
import torch
from torch import nn

import autoshard
import xla_dtensor.spmd as xs
from autoshard.cache import PlanCacheWarning
from mesh import Mesh
from tests._train import train

import xla_dtensor


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 64), nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x))).pow(2).mean()


def _model() -> nn.Module:
    torch.manual_seed(0)
    return _Net()


def _run(model, batch, cache_dir, dev=None):
    if dev is not None:
        model = xs.distribute_module(model, Mesh(range(8), (2, 4), ("data", "model")),
                                     partition_fn=xs.AutoPolicy(topology="cpu", cache_dir=cache_dir, time_limit=20))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return train(model, [(batch,)] * 2, opt, put=(lambda t: t.to(dev)) if dev else None,
                 sync=xla_dtensor.sync if dev else None)


@pytest.mark.parametrize("bad", ["five_entries", "split_99"])
def test_auto_re_solves_a_bad_cached_plan_with_a_warning(dev, tmp_path, bad):
    batch = torch.randn(32, 16, generator=torch.Generator().manual_seed(1))
    ref = _run(_model(), batch, None)
    autoshard.api.clear_cache()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _run(_model(), batch, tmp_path, dev)
    files = list(tmp_path.glob("*.json"))
    assert files
    for f in files:
        d = json.loads(f.read_text())
        for name in d["placements"]:
            d["placements"][name] = ["R"] * 5 if bad == "five_entries" else [["S", 99], "R"]
        f.write_text(json.dumps(d))
    autoshard.api.clear_cache()
    with pytest.warns(PlanCacheWarning, match="does not fit this graph and mesh"):
        got = _run(_model(), batch, tmp_path, dev)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(ref), rtol=1e-4, atol=1e-6)
