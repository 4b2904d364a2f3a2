"""transformers' GPT-2 in lazy mode against torch eager: a model the project did not write, on one CPU thread.

The model of ``benchmarks/lazy_overhead.py`` is the project's own GPT. This is transformers'
``GPT2LMHeadModel`` at the same size (12 layers, width 64, 4 heads, vocabulary 64, sequence 32,
batch 2; dropout 0; AdamW), random weights, trained as users train it, ``model(input_ids=x,
labels=x).loss``, in two configurations that take different paths through transformers:

* ``use_cache=False`` (training scripts set it): no KV cache, so each forward reads to the host
  whether the positions pack several sequences (``masking_utils.find_packed_sequence_indices``): a
  host read, and a partial barrier, in the middle of every step;
* ``use_cache=True`` (the config's default): a ``DynamicCache`` whose layers start from
  ``torch.tensor([], device=...)``: two empty host tensors per layer per step (recorded as ``aten.empty``;
  sent to the device before this session's change).

Cases, each in its own process (``torch.set_num_threads(1)``), stepping in turn one step each round
after 3 warm-up steps (the machine's speed drifts over minutes): torch eager on CPU and lazy on the
``jax`` device (``xla_dtensor.sync()`` after each step, waited for outside the clock), each in both
configurations. Host time is the calling thread's CPU time (``time.thread_time``). Per case: the
median ms per step, its ratio to torch eager in the same configuration (the median of the rounds' ratios), the parts of a
step (forward, backward, optimizer with ``zero_grad``, sync; medians), and per step the ops
recorded, the syncs whose plan was read off the tape (``plans_reused``), host reads and
transfers to the device.

Usage: PYTHONPATH=. python benchmarks/hf_lazy_step.py [--rounds 20] [--label current] [--no-save]

Writes ``benchmarks/results/hf_lazy_step.md`` (a section per ``--label``, other labels' sections kept)
and ``benchmarks/results/hf_lazy_step.png``. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
N_LAYER, N_EMBD, N_HEAD, SEQ, BATCH, VOCAB = 12, 64, 4, 32, 2, 64
CASES = ("torch_no_cache", "torch_cache", "lazy_no_cache", "lazy_cache")
COUNTERS = ("ops_recorded", "plans_reused", "transfers_to_host", "transfers_to_device")


def _model(case: str) -> tuple[Any, Any, Any, Any, Any]:
    """(model, optimizer, batch, sync, counters) of ``case`` on its device."""
    import torch

    from benchmarks.models.torchvision_shim import install
    install()  # transformers imports torchvision, whose C++ ops do not load on CPU torch
    import transformers
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=N_EMBD, n_layer=N_LAYER, n_head=N_HEAD,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  use_cache=not case.endswith("no_cache"))
    if case.startswith("torch"):
        dev, sync, counters = torch.device("cpu"), (lambda: None), (lambda: dict.fromkeys(COUNTERS, 0))
    else:
        import xla_dtensor
        from xla_dtensor import metrics
        dev, sync = xla_dtensor.device(), xla_dtensor.sync
        counters = lambda: {k: metrics.counters()[k] for k in COUNTERS}  # noqa: E731
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, VOCAB, (BATCH, SEQ)).to(dev)
    return model, opt, x, sync, counters


def _worker(case: str) -> None:
    """One case's process: a step (timed by parts) per ``step`` line on stdin, its figures on stdout."""
    import torch

    from benchmarks._in_turn import serve, step_parts
    torch.set_num_threads(1)
    model, opt, x, sync, counters = _model(case)
    wait = (lambda: None) if case.startswith("torch") else __import__("xla_dtensor").wait

    def step() -> dict:
        before = counters()
        parts = step_parts(lambda x: model(input_ids=x, labels=x).loss, opt, (x,), 1, sync)
        wait()
        after = counters()
        return {"ms": sum(parts.values()), "parts": list(parts.values()),
                **{k: after[k] - before[k] for k in COUNTERS}}
    serve(step)


def _in_turn(rounds: int) -> dict[str, list[dict]]:
    """Each case's figures per round, the cases stepping in turn (3 warm-up rounds dropped)."""
    from benchmarks._in_turn import step_in_turn
    procs = {c: subprocess.Popen([sys.executable, __file__, "--worker", c], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) for c in CASES}
    try:
        for c, p in procs.items():
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"case {c} did not start (exit {p.wait()}); run it alone: "
                                   f"python {__file__} --worker {c}")
        return step_in_turn(procs, rounds, progress=True)
    finally:
        for p in procs.values():
            p.stdin.close()
            p.wait()


def _table(label: str, got: dict[str, list[dict]]) -> str:
    med = statistics.median
    lines = [f"## {label}", "", "```",
             f"{'case':16s} {'ms/step':>8s} {'/torch':>7s} {'forward':>8s} {'backward':>9s} {'optimizer':>10s} "
             f"{'sync':>6s} {'ops':>6s} {'us/op':>6s} {'reused':>7s} {'reads':>6s} {'to dev':>7s}"]
    for c in CASES:
        steps = got[c]
        ms = [s["ms"] for s in steps]
        torch_ms = [s["ms"] for s in got["torch" + c[c.index("_"):]]]  # torch eager in the same configuration
        ratio = med(a / b for a, b in zip(ms, torch_ms))
        parts = [med(s["parts"][i] for s in steps) for i in range(4)]
        per = {k: med(s[k] for s in steps) for k in COUNTERS}
        us_op = 1e3 * med(ms) / per["ops_recorded"] if per["ops_recorded"] else float("nan")
        lines.append(f"{c:16s} {med(ms):8.2f} {ratio:7.2f} {parts[0]:8.2f} {parts[1]:9.2f} {parts[2]:10.2f} "
                     f"{parts[3]:6.2f} {per['ops_recorded']:6.0f} {us_op:6.2f} {per['plans_reused']:7.0f} "
                     f"{per['transfers_to_host']:6.0f} {per['transfers_to_device']:7.0f}")
    lines += ["```", "",
              f"{len(got[CASES[0]])} rounds in turn, one step per case each; ms: the calling thread's CPU time; /torch: "
              "the median over rounds of the case's step / torch eager's in the same configuration; parts, ops, reused (syncs whose plan was read "
              "off the tape), reads (host reads) and to dev (host-to-device transfers): medians per step.", ""]
    return "\n".join(lines)


def _save(label: str, section: str, got: dict[str, list[dict]]) -> None:
    from benchmarks._in_turn import save_section
    head = "# transformers' GPT-2: lazy mode against torch eager (benchmarks/hf_lazy_step.py)\n\n"
    save_section(RESULTS / "hf_lazy_step.md", head, label, section)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4))
    names = ["forward", "backward", "optimizer", "sync"]
    bottom = [0.0] * len(CASES)
    for i, name in enumerate(names):
        vals = [statistics.median(s["parts"][i] for s in got[c]) for c in CASES]
        ax.bar(list(CASES), vals, 0.5, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_ylabel("calling-thread CPU ms / step (medians of parts)")
    ax.set_title(f"transformers GPT-2, 12 layers, width 64 ({label})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / "hf_lazy_step.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--label", default="current")
    p.add_argument("--no-save", action="store_true")
    p.add_argument("--worker", choices=CASES, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        _worker(args.worker)
        return
    got = _in_turn(args.rounds)
    section = _table(args.label, got)
    print(section)
    if not args.no_save:
        _save(args.label, section, got)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # ``benchmarks.*`` from a plain checkout
    main()
