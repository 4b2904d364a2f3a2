"""Third-party models in every mode: the integration matrix page and the step-time table.

Two jobs:

* **Matrix** (default): runs ``tests/integration/test_matrix.py`` with
  ``XLA_DTENSOR_MATRIX_JSON`` set, saves the outcomes to
  ``benchmarks/results/models_matrix.json`` and splices the table generated from them into
  ``docs/models.md`` (``--render``: from the saved JSON only, no test run).
* **Step times** (``--bench``): each model's steady training step (median of the steps
  after the two warm-up steps, lazy mode, 8 virtual CPU devices) under every manual mode
  and AUTO, the ratio of the best manual one to AUTO; writes
  ``benchmarks/results/models_bench.{md,json,png}``.

Usage:
    PYTHONPATH=. python benchmarks/models_matrix.py [--render] [--bench [--steps N] [--only M1,M2]]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
MATRIX_JSON = RESULTS / "models_matrix.json"
DOC = ROOT / "docs" / "models.md"
MARK = {"passed": "pass", "failed": "**FAIL**", "skipped": "n/a"}


def run_matrix() -> int:
    """Run the matrix tests, saving their outcomes; pytest's exit code."""
    env = dict(os.environ, XLA_DTENSOR_MATRIX_JSON=str(MATRIX_JSON), PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "pytest", "tests/integration/test_matrix.py", "-q", "-p", "no:cacheprovider",
           "-m", "slow or not slow"]  # every cell, the slow tier's too
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


def matrix_table(rows: list[dict]) -> str:
    """Models x modes: pass / FAIL / n/a, with the reasons of the n/a and FAIL cells as notes."""
    from benchmarks.models.zoo import ZOO
    from benchmarks.models.zoo_train import MODES

    by = {(r["model"], r["mode"]): r for r in rows}
    notes: list[str] = []
    lines = ["| model | " + " | ".join(MODES) + " |", "|---|" + "---|" * len(MODES)]
    for name in ZOO:
        cells = []
        for mode in MODES:
            r = by.get((name, mode))
            if r is None or "outcome" not in r:
                cells.append("not run")
                continue
            cell = MARK[r["outcome"]]
            if r["outcome"] != "passed":
                reason = r.get("reason", "")
                if reason not in notes:
                    notes.append(reason)
                cell += f" [{notes.index(reason) + 1}]"
            elif mode.startswith("auto") and "plan" in r:
                p = r["plan"]
                cell += f" ({p['params_sharded']}/{p['params']} params sharded" + \
                    (", batch split)" if p["batch_sharded"] else ")")
            cells.append(cell)
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    done = [r for r in rows if "outcome" in r]
    counts = {k: sum(1 for r in done if r["outcome"] == k) for k in MARK}
    lines += ["", f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} not applicable "
              f"(of {len(done)} cells). Pass: {_steps()} AdamW steps match torch CPU (rtol 1e-3) and nothing "
              "compiles after step 2."]
    if notes:
        lines += [""] + [f"[{i + 1}] {n}" for i, n in enumerate(notes)]
    return "\n".join(lines)


def _steps() -> int:
    from tests.integration.test_matrix import STEPS
    return STEPS


def render() -> None:
    """Splice the matrix table generated from the saved JSON into docs/models.md."""
    from benchmarks._report import splice

    rows = json.loads(MATRIX_JSON.read_text())
    table = matrix_table(rows)
    DOC.write_text(splice(DOC.read_text(), table))
    print(table)
    print(f"updated {DOC} from {MATRIX_JSON}")


# -- step times -----------------------------------------------------------------------------
def bench(steps: int, only: list[str] | None) -> None:
    """Median steady step per (model, mode); AUTO against the best manual mode."""
    import xla_dtensor  # noqa: F401  (before any CPU backward)
    from benchmarks.models.zoo import ZOO, torchvision_unavailable
    from benchmarks.models.zoo_train import BENCH_MODES, train, unsupported

    rows = []
    for name, zm in ZOO.items():
        if only and name not in only:
            continue
        if "timm" in zm.needs and torchvision_unavailable():
            print(f"{name}: skipped ({torchvision_unavailable()})", flush=True)
            continue
        for mode in BENCH_MODES:
            if unsupported(zm, mode) is not None:
                continue
            try:
                r = train(zm, mode, steps)
                row = dict(model=name, mode=mode, step_ms=r.step_ms, compiles=r.compiles_after_warmup)
            except Exception as e:  # noqa: BLE001  (a failing mode is a row of the table, not the end of the run)
                row = dict(model=name, mode=mode, error=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
            rows.append(row)
            print(f"{name:<15} {mode:<9} " + (f"{row['step_ms']:8.1f} ms  compiles after warm-up {row['compiles']}"
                                             if "step_ms" in row else row["error"]), flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "models_bench.json").write_text(json.dumps(rows, indent=1))
    table = bench_table(rows, steps)
    (RESULTS / "models_bench.md").write_text(table + "\n")
    print(table)
    _plot(rows)


def bench_table(rows: list[dict], steps: int) -> str:
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | AUTO 1x8 ms | AUTO 2x4 ms | best manual ms | best manual / AUTO | single device ms | "
             "every mode (ms) |", "|---|---|---|---|---|---|---|"]
    for m in models:
        ok = {r["mode"]: r["step_ms"] for r in rows if r["model"] == m and "step_ms" in r}
        manual = {k: v for k, v in ok.items() if not k.startswith("auto") and k != "single"}
        autos = [v for k, v in ok.items() if k.startswith("auto")]
        best_k = min(manual, key=manual.get) if manual else None
        ratio = f"{manual[best_k] / min(autos):.2f}x" if best_k and autos else "-"
        every = ", ".join(f"{k} {v:.1f}" for k, v in ok.items())
        errs = [f"{r['mode']}: {r['error']}" for r in rows if r["model"] == m and "error" in r]
        lines.append(f"| {m} | {_ms(ok.get('auto-1x8'))} | {_ms(ok.get('auto-2x4'))} | "
                     f"{_ms(manual.get(best_k)) + f' ({best_k})' if best_k else '-'} | {ratio} | "
                     f"{_ms(ok.get('single'))} | {every}" + (f"; failed: {'; '.join(errs)}" if errs else "") + " |")
    lines += ["", f"Median of steps 3-{steps} (lazy mode: tracing and execution) on 8 virtual CPU devices sharing "
              "the machine's cores; ratio above 1: AUTO (the faster of its two meshes) is faster than the best "
              "manual mode (DP, FSDP, Megatron TP, TP+SP, the library's own TP)."]
    return "\n".join(lines)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f}"


def _plot(rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    fig, ax = plt.subplots(figsize=(max(8, len(models) * 1.2), 4.8))
    width = 0.8 / max(len(modes), 1)
    for j, mode in enumerate(modes):
        xs, ys = [], []
        for i, m in enumerate(models):
            r = next((r for r in rows if r["model"] == m and r["mode"] == mode and "step_ms" in r), None)
            if r is not None:
                xs.append(i + j * width - 0.4 + width / 2)
                ys.append(r["step_ms"])
        ax.bar(xs, ys, width, label=mode)
    ax.set_xticks(range(len(models)), models, fontsize=7, rotation=30)
    ax.set_ylabel("steady step ms (lazy, 8 virtual CPU devices)")
    ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=4)
    fig.tight_layout()
    fig.savefig(RESULTS / "models_bench.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--render", action="store_true", help="only regenerate docs/models.md from the saved JSON")
    ap.add_argument("--bench", action="store_true", help="the step-time table instead of the matrix")
    ap.add_argument("--steps", type=int, default=6, help="training steps per (model, mode) with --bench (default 6)")
    ap.add_argument("--only", default=None, help="comma-separated model names (default: all)")
    args = ap.parse_args(argv)
    if args.steps < 3:
        ap.error(f"--steps must be >= 3 (two warm-up steps, then timed ones), got {args.steps}")
    if args.bench:
        bench(args.steps, args.only.split(",") if args.only else None)
        return 0
    code = 0 if args.render else run_matrix()
    render()
    return code


if __name__ == "__main__":
    sys.exit(main())
