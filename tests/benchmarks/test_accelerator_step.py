"""Smoke test of benchmarks/accelerator_step.py on CPU: the driver (one process per case, JSON
lines, table, plot) and the runners, at the small size."""
from __future__ import annotations

import json

import pytest

from benchmarks import accelerator_step as bench


@pytest.mark.parametrize("runner", ["torch-eager", "jax", "lazy", "lazy-phased"])
def test_runner_in_process(runner):
    import xla_dtensor
    row = bench.run_case(dict(model="gpt", size="small", dtype="float32", runner=runner, steps=2, warmup=1))
    assert row["step_ms"] > 0 and len(row["steps_ms"]) == 2 and row["piped_ms"] > 0
    assert xla_dtensor.config.launch_at_backward is None  # the runner's setting is undone
    if runner.startswith("lazy"):
        assert row["phased"] is (runner == "lazy-phased")  # on CPU lazy mode's default runs the step whole
        # its step split: recording, sync(), reading the loss (wall ms of each)
        assert min(row["record_ms"], row["sync_ms"], row["read_ms"]) > 0
        assert row["record_ms"] + row["sync_ms"] + row["read_ms"] <= 1.05 * max(row["steps_ms"])


def test_driver_runs_our_compiled_step_in_its_own_process(tmp_path, capsys):
    code = bench.main(["--models", "gpt", "--sizes", "small", "--dtypes", "float32", "--runners",
                       "xla-compile", "--steps", "2", "--warmup", "1", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().out
    (row,) = [json.loads(line) for line in (tmp_path / "accelerator_step_cpu.json").read_text().splitlines()]
    layers = bench.SIZES["small"]["n_layer"]
    assert row["runner"] == "xla-compile" and row["step_ms"] > 0
    assert (row["fused_attention"], row["fused_attention_fallbacks"]) == (layers, 0)  # traced once, CPU: XLA's math
    table = (tmp_path / "accelerator_step_cpu.md").read_text()
    assert "| gpt | small | float32 |" in table
    assert (tmp_path / "accelerator_step_cpu.png").stat().st_size > 0


def test_unknown_runner_is_rejected_with_the_choices(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--runners", "tensorflow"])
    assert "unknown runners ['tensorflow']; choose from" in capsys.readouterr().err
