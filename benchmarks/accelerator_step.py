"""A GPT training step on whatever accelerator JAX and torch find: torch eager, torch.compile,
pure JAX, pure JAX with cuDNN attention, our lazy mode and ``xla_dtensor.compile``.

Each case (model x size x dtype x runner) runs in a process of its own and prints one JSON
line: the median step time over ``--steps`` steps after ``--warmup`` warm-up steps (each
step ends with the loss read on the host), the calling thread's CPU time per step, the step
with the loss read only every ``PIPE`` steps (the host's work then overlaps the device's), and
for our runners the attention ops taken through the fused path; lazy mode's rows also split
its step into recording, ``sync()`` and reading the loss. ``lazy-python`` is lazy mode with the
recorder's Python path (``XLA_DTENSOR_NATIVE=0``); ``lazy-whole`` and ``lazy-phased`` set
``config.launch_at_backward`` to ``False`` (the step as one program from ``sync()``) and ``True`` (the
forward launched as ``backward()`` starts, the backward as it ends), where ``lazy`` takes the
default (phased on a GPU or TPU, whole on CPU). The driver collects the lines, prints the
tables, and writes ``benchmarks/results/accelerator_step_<platform>.{json,md,png}``
(``--merge`` keeps the saved rows of the cases not run now).

Models: ``gpt`` is the project's GPT-2-style model (``autoshard.models.GPT2``, SDPA
attention) and, for the pure JAX runners, its twin written in JAX
(``benchmarks/models/gpt2_jax.py``: attention as einsum/softmax/einsum, or
``jax.nn.dot_product_attention(implementation="cudnn")``); ``hf-gpt2`` is transformers'
``GPT2LMHeadModel`` (SDPA attention), torch runners and ours only. ``bfloat16`` casts the
whole model (weights, activations, SGD) to bf16; ``float32`` lets matmuls use TF32.

Usage:
    python benchmarks/accelerator_step.py                       # every case for this machine
    python benchmarks/accelerator_step.py --sizes small --runners torch-eager,xla-compile
    python benchmarks/accelerator_step.py --dtypes float32 --runners torch-eager,lazy --merge

From a source checkout that was not installed with pip, build the lazy recorder's C hot path
first (``python setup.py build_ext --inplace``); without it lazy mode records in Python and
says so at import.

Example:
    >>> sorted(SIZES)
    ['medium', 'small']
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
SIZES = {  # layers, width, heads, sequence, batch, vocab
    "small": dict(n_layer=2, n_embd=64, n_head=4, seq=32, batch=2, vocab=256),
    "medium": dict(n_layer=12, n_embd=768, n_head=12, seq=512, batch=16, vocab=8192),
}
RUNNERS = ("torch-eager", "torch-compile", "jax", "jax-cudnn", "lazy", "lazy-whole", "lazy-phased", "lazy-python",
           "xla-compile")
PHASED = {"lazy-whole": False, "lazy-phased": True}  # config.launch_at_backward of these lazy runners
MODELS = ("gpt", "hf-gpt2")
DTYPES = ("float32", "bfloat16")
LR = 1e-3
PIPE = 5  # the piped measure reads the loss every PIPE steps


def _skip(model: str, dtype: str, runner: str, platform: str) -> str | None:
    """Why a case is not run (None: it runs)."""
    if model == "hf-gpt2" and runner.startswith("jax"):
        return "no JAX port of HF GPT-2"
    if runner == "jax-cudnn" and (platform != "gpu" or dtype != "bfloat16"):
        return "cuDNN attention: GPU, bf16/fp16 only"
    if runner.startswith("lazy") and dtype == "bfloat16":
        return "lazy mode is host-bound: float32 only"
    return None


# ---- one case, in its own process ----------------------------------------------------------------

def _batches(size: dict, n: int, seed: int = 0) -> list[tuple[Any, Any]]:
    import torch
    g = torch.Generator().manual_seed(seed)
    shape = (size["batch"], size["seq"])
    return [(torch.randint(0, size["vocab"], shape, generator=g), torch.randint(0, size["vocab"], shape, generator=g))
            for _ in range(n)]


def _torch_model(model: str, size: dict) -> Any:
    import torch
    torch.manual_seed(0)
    if model == "gpt":
        from autoshard.models import GPT2, GPT2Config
        return GPT2(GPT2Config(vocab=size["vocab"], n_positions=size["seq"], n_embd=size["n_embd"],
                               n_layer=size["n_layer"], n_head=size["n_head"]))
    from benchmarks.models.torchvision_shim import install
    install()  # transformers imports torchvision, whose C++ ops do not load on CPU torch
    import transformers
    cfg = transformers.GPT2Config(vocab_size=size["vocab"], n_positions=size["seq"], n_embd=size["n_embd"],
                                  n_layer=size["n_layer"], n_head=size["n_head"], resid_pdrop=0.0, embd_pdrop=0.0,
                                  attn_pdrop=0.0, attn_implementation="sdpa")
    return transformers.GPT2LMHeadModel(cfg)


def _loss_fn(model: str) -> Callable[[Any, Any, Any], Any]:
    if model == "gpt":
        return lambda m, x, y: m(x, y)
    return lambda m, x, y: m(input_ids=x, labels=y).loss


def _time_steps(step: Callable[[Any, Any, bool], Any], batches: list, warmup: int,
                piped: list | None = None) -> tuple[list[float], list[float]]:
    """Wall and calling-thread CPU milliseconds of each step after the warm-up ones, each step ending
    with the loss read on the host. With ``piped``, then run the batches again reading the loss only
    every ``PIPE`` steps and append each block's wall milliseconds per step to ``piped``: the host's
    work for the next steps then overlaps the device's, as in a loop that logs every few steps."""
    wall, cpu = [], []
    for i, (x, y) in enumerate(batches):
        t0, c0 = time.perf_counter(), time.thread_time()
        step(x, y, True)
        if i >= warmup:
            wall.append((time.perf_counter() - t0) * 1e3)
            cpu.append((time.thread_time() - c0) * 1e3)
    if piped is not None:
        timed = batches[warmup:]
        block = max(1, min(PIPE, len(timed)))  # fewer timed steps than PIPE (a smoke run): one block of them all
        for b in range(0, len(timed) - block + 1, block):
            t0 = time.perf_counter()
            for j, (x, y) in enumerate(timed[b:b + block]):
                step(x, y, j == block - 1)
            piped.append((time.perf_counter() - t0) * 1e3 / block)
    return wall, cpu


def _run_torch(case: dict, batches: list) -> tuple[list[float], list[float], dict]:
    import torch
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    model = _torch_model(case["model"], SIZES[case["size"]]).to(dev, getattr(torch, case["dtype"]))
    fwd = torch.compile(model) if case["runner"] == "torch-compile" else model
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_of = _loss_fn(case["model"])

    def step(x: Any, y: Any, read: bool) -> float | None:
        loss = loss_of(fwd, x.to(dev), y.to(dev))
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss.item() if read else None
    piped: list[float] = []
    wall, cpu = _time_steps(step, batches, case["warmup"], piped)
    return wall, cpu, {"device": dev, "piped_ms": statistics.median(piped)}


def _run_ours(case: dict, batches: list) -> tuple[list[float], list[float], dict]:
    import torch
    import xla_dtensor
    from xla_dtensor import metrics
    dev = xla_dtensor.device()
    model = _torch_model(case["model"], SIZES[case["size"]]).to(getattr(torch, case["dtype"])).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    loss_of = _loss_fn(case["model"])

    def train(x: Any, y: Any) -> Any:
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    compiled = xla_dtensor.compile(train) if case["runner"] == "xla-compile" else None

    parts: dict[str, list[float]] = {"record_ms": [], "sync_ms": [], "read_ms": []}

    def step(x: Any, y: Any, read: bool) -> float | None:
        if compiled is not None:
            loss = compiled(x.to(dev), y.to(dev))
            return loss.item() if read else None
        t0 = time.perf_counter()
        loss = train(x.to(dev), y.to(dev))
        t1 = time.perf_counter()
        xla_dtensor.sync()
        t2 = time.perf_counter()
        value = loss.item() if read else None
        for key, ms in zip(parts, (t1 - t0, t2 - t1, time.perf_counter() - t2)):
            parts[key].append(1e3 * ms)
        return value
    from xla_dtensor.core import phases
    saved = xla_dtensor.config.launch_at_backward
    xla_dtensor.config.launch_at_backward = PHASED.get(case["runner"], saved)  # lazy: the default
    try:
        phased = compiled is None and phases.launches()
        before = metrics.counters()
        piped: list[float] = []
        wall, cpu = _time_steps(step, batches, case["warmup"], piped)
        after = metrics.counters()
    finally:
        xla_dtensor.config.launch_at_backward = saved
    steps = case["warmup"] + case["steps"]  # the lazy parts of the steps that read every loss
    split = {k: statistics.median(v[case["warmup"]:steps]) for k, v in parts.items() if v}
    import jax
    from xla_dtensor.core import native
    facts = {k: after[k] - before[k] for k in ("fused_attention", "fused_attention_fallbacks", "compiles")}
    return wall, cpu, {"device": str(jax.devices()[0].platform), **facts, **split, "native": native.ON,
                       "piped_ms": statistics.median(piped), "phased": phased}


def _run_jax(case: dict, batches: list) -> tuple[list[float], list[float], dict]:
    import jax
    import jax.numpy as jnp
    from benchmarks.models import gpt2_jax
    size = SIZES[case["size"]]
    dtype = jnp.dtype(case["dtype"])
    params = jax.tree_util.tree_map(lambda a: a.astype(dtype),
                                    gpt2_jax.params_from_torch(_torch_model("gpt", size)))
    attention = "cudnn" if case["runner"] == "jax-cudnn" else "math"

    @jax.jit
    def sgd(p: Any, x: Any, y: Any) -> tuple[Any, Any]:
        loss, g = jax.value_and_grad(gpt2_jax.loss_fn)(p, x, y, size["n_head"], attention)
        return jax.tree_util.tree_map(lambda a, b: a - LR * b, p, g), loss
    state = [params]

    def step(x: Any, y: Any, read: bool) -> float | None:
        state[0], loss = sgd(state[0], jnp.asarray(x.numpy()), jnp.asarray(y.numpy()))
        return float(loss) if read else None
    piped: list[float] = []
    wall, cpu = _time_steps(step, batches, case["warmup"], piped)
    return wall, cpu, {"device": str(jax.devices()[0].platform), "piped_ms": statistics.median(piped)}


def run_case(case: dict) -> dict:
    """Run one case here and return its JSON row."""
    batches = _batches(SIZES[case["size"]], case["warmup"] + case["steps"])
    runner = case["runner"]
    run = _run_torch if runner.startswith("torch") else _run_jax if runner.startswith("jax") else _run_ours
    wall, cpu, facts = run(case, batches)
    return {**case, **facts, "step_ms": statistics.median(wall), "cpu_ms": statistics.median(cpu),
            "steps_ms": [round(w, 3) for w in wall]}


# ---- the driver ------------------------------------------------------------------------------------

def _platform() -> str:
    out = subprocess.run([sys.executable, "-c", "import jax; print(jax.default_backend())"], capture_output=True,
                         text=True, env={**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "")})
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else "cpu"


def _one(case: dict, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--case", json.dumps(case)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if case["runner"] == "lazy-python":  # the recorder's Python reference path (xla_dtensor.core.native)
        env["XLA_DTENSOR_NATIVE"] = "0"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {**case, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        tail = (out.stderr or out.stdout).strip().splitlines()[-3:]
        return {**case, "error": f"exit {out.returncode}: " + " | ".join(tail)}
    return json.loads(lines[-1])


def table(rows: list[dict]) -> str:
    """Markdown: one row per (model, size, dtype), median step ms per runner, and our ratios."""
    keys = sorted({(r["model"], r["size"], r["dtype"]) for r in rows}, key=lambda k: (k[0], -len(k[1]), k[2]))
    cell = {(r["model"], r["size"], r["dtype"], r["runner"]): r for r in rows}
    head = ["model", "size", "dtype", *RUNNERS, "xla-compile / torch-compile", "xla-compile / jax-cudnn",
            "fused attention (fallbacks)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for m, s, d in keys:
        def ms(runner: str) -> float | None:
            r = cell.get((m, s, d, runner))
            return None if r is None or "step_ms" not in r else r["step_ms"]
        cells = []
        for runner in RUNNERS:
            r = cell.get((m, s, d, runner))
            cells.append("-" if r is None else f"{r['step_ms']:.2f}" if "step_ms" in r else "error")
        ratio = lambda a, b: f"{ms(a) / ms(b):.3g}x" if ms(a) and ms(b) else "-"  # noqa: E731
        ours = cell.get((m, s, d, "xla-compile"), {})
        fused = f"{ours['fused_attention']} ({ours['fused_attention_fallbacks']})" if "fused_attention" in ours else "-"
        lines.append("| " + " | ".join([m, s, d, *cells, ratio("xla-compile", "torch-compile"),
                                        ratio("xla-compile", "jax-cudnn"), fused]) + " |")
    return "\n".join(lines)


def lazy_table(rows: list[dict]) -> str:
    """Markdown: each runner's step with the loss read every step and every ``PIPE`` steps, against torch
    eager's, and where lazy mode's step goes (recording, ``sync()``, reading the loss)."""
    eager = {(r["model"], r["size"], r["dtype"]): r for r in rows if r["runner"] == "torch-eager" and "step_ms" in r}
    head = ["model", "size", "dtype", "runner", "step ms", f"piped ms (loss every {PIPE})", "/ torch-eager",
            "piped / torch-eager piped", "thread CPU ms", "record ms", "sync ms", "read ms"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    for r in sorted((r for r in rows if "piped_ms" in r), key=lambda r: (r["model"], r["dtype"],
                                                                          RUNNERS.index(r["runner"]))):
        e = eager.get((r["model"], r["size"], r["dtype"]), {})
        ratio = lambda a, b: f"{a / b:.3g}x" if a and b else "-"  # noqa: E731
        lines.append("| " + " | ".join([r["model"], r["size"], r["dtype"], r["runner"], fmt(r["step_ms"]),
                                        fmt(r["piped_ms"]), ratio(r["step_ms"], e.get("step_ms")),
                                        ratio(r["piped_ms"], e.get("piped_ms")), fmt(r["cpu_ms"]),
                                        *(fmt(r.get(k)) for k in ("record_ms", "sync_ms", "read_ms"))]) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Grouped bars: median step ms per runner, one group per (model, size, dtype)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    groups = sorted({(r["model"], r["size"], r["dtype"]) for r in rows if "step_ms" in r})
    fig, ax = plt.subplots(figsize=(max(6, 2.2 * len(groups)), 4))
    width = 0.8 / len(RUNNERS)
    for i, runner in enumerate(RUNNERS):
        ys = [next((r["step_ms"] for r in rows if (r["model"], r["size"], r["dtype"]) == g and r["runner"] == runner
                    and "step_ms" in r), 0.0) for g in groups]
        ax.bar([j + i * width for j in range(len(groups))], ys, width, label=runner)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(groups))], ["\n".join(g) for g in groups])
    ax.set_ylabel("median step ms (lower is better)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", help="run one case (JSON) in this process and print its row")
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--sizes", default=None, help="default: medium on an accelerator, small on CPU")
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--runners", default=",".join(RUNNERS))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per case")
    p.add_argument("--budget", type=float, default=3600.0, help="seconds for all cases: later ones are left out")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--merge", action="store_true", help="keep the saved rows of cases not run now")
    args = p.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(json.loads(args.case))), flush=True)
        return 0
    platform = _platform()
    sizes = (args.sizes or ("small" if platform == "cpu" else "medium")).split(",")
    for name, allowed, given in (("models", MODELS, args.models), ("sizes", SIZES, ",".join(sizes)),
                                 ("dtypes", DTYPES, args.dtypes), ("runners", RUNNERS, args.runners)):
        bad = [v for v in given.split(",") if v not in allowed]
        if bad:
            p.error(f"unknown {name} {bad}; choose from {list(allowed)}")
    cases = [dict(model=m, size=z, dtype=d, runner=r, steps=args.steps, warmup=args.warmup)
             for m in args.models.split(",") for z in sizes for d in args.dtypes.split(",")
             for r in args.runners.split(",") if not _skip(m, d, r, platform)]
    cases.sort(key=_priority)
    rows: list[dict] = []
    saved = _stem(args.out, platform).with_suffix(".json")
    if args.merge and saved.exists():
        now = {_key(c) for c in cases}
        rows = [r for r in map(json.loads, saved.read_text().splitlines()) if _key(r) not in now]
    start = time.perf_counter()
    for case in cases:
        left = args.budget - (time.perf_counter() - start)
        if left < 20:
            print(f"time budget spent: {case['model']} {case['dtype']} {case['runner']} not run", flush=True)
            continue
        t0 = time.perf_counter()
        row = _one(case, min(args.timeout, left))
        rows.append(row)
        shown = f"{row['step_ms']:.2f} ms" if "step_ms" in row else row["error"]
        print(f"[{time.perf_counter() - t0:5.1f} s] {case['model']} {case['size']} {case['dtype']} {case['runner']}: "
              f"{shown}", flush=True)
        _write(rows, args, platform)
    print(_write(rows, args, platform))
    return 0 if rows and all("step_ms" in r for r in rows) else 1


def _stem(out: Path, platform: str) -> Path:
    """Where the results of ``platform`` go (``.json``, ``.md``, ``.png`` beside it)."""
    return out / f"accelerator_step_{platform}"


def _key(case: dict) -> tuple:
    return case["model"], case["size"], case["dtype"], case["runner"]


def _priority(case: dict) -> tuple:
    """Run order: what the comparison needs first (compiled runners, bf16, our GPT), eager and lazy last."""
    rank = {"torch-compile": 0, "xla-compile": 1, "jax-cudnn": 2, "jax": 3, "torch-eager": 4, "lazy": 5,
            "lazy-whole": 6, "lazy-phased": 7, "lazy-python": 8}
    return (rank[case["runner"]] >= 4, case["model"] != "gpt", case["dtype"] != "bfloat16", case["size"],
            rank[case["runner"]])


def _write(rows: list[dict], args: argparse.Namespace, platform: str) -> str:
    """Write the JSON lines, the table and the plot for ``rows`` (after every case: a cut-off run keeps them)."""
    args.out.mkdir(parents=True, exist_ok=True)
    stem = _stem(args.out, platform)
    stem.with_suffix(".json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    text = table(rows)
    stem.with_suffix(".md").write_text(f"# Training step, {platform}\n\nMedian of {args.steps} steps after "
                                       f"{args.warmup} warm-up steps, SGD, one process per case "
                                       f"(`python benchmarks/accelerator_step.py`).\n\n{text}\n\n"
                                       f"## Loss read every step and every {PIPE} steps\n\n{lazy_table(rows)}\n")
    plot(rows, stem.with_suffix(".png"))
    return text


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
