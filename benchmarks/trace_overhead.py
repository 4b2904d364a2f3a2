"""Host overhead of the lazy core vs plain ``jax.jit`` of the same computation.

Per-op: chains of N ``add`` / ``mm`` / ``view`` ops recorded on a cache hit (the
graph compiled in warm-up), microseconds of host time per recorded op, next to one
call of the same program as a ``jax.jit``-compiled function (its host time / N).
Per-step: host milliseconds of a GPT-2 training step (forward, backward, AdamW,
``sync()`` on a cache hit) vs calling the step's own compiled executable directly.
Prints medians and ratios; saves ``trace_overhead.png``. A benchmark, not a test.

Usage: PYTHONPATH=. python benchmarks/trace_overhead.py [--n 2000] [--reps 7]
"""
from __future__ import annotations

import argparse
import statistics
import time

import xla_dtensor  # noqa: I001  (sets up devices before jax)
import jax
import torch

from benchmarks.models import GPT2, GPT2Config
from xla_dtensor.core import executor


def _capture_program() -> list:
    """Wrap executor.execute to remember the last (compiled, args) it ran."""
    seen: list = [False]
    real = executor.execute

    def spy(roots, donate=None):
        if seen[0]:  # copy the inputs before the step donates them
            _, leaves, *_ = executor._plan(roots)
            seen[1:] = [[jax.numpy.array(n.data, copy=True) if isinstance(n.data, jax.Array) else n.data
                         for n in leaves]]
        return real(roots, donate)
    executor.execute = spy
    return seen


def chain(kind: str, x: torch.Tensor, w: torch.Tensor, n: int) -> torch.Tensor:
    y = x
    for _ in range(n):
        if kind == "add":
            y = y + x
        elif kind == "mm":
            y = y @ w
        else:  # views of the same base (a view chain n deep costs O(n) in torch's own view tracking)
            y = x.view(64).view(8, 8)
    return y


def bench_ops(n: int, reps: int) -> dict[str, tuple[float, float]]:
    dev = xla_dtensor.device()
    x, w = torch.randn(8, 8, device=dev), torch.randn(8, 8, device=dev) * 0.1
    xla_dtensor.sync()
    out = {}
    for kind in ("add", "mm", "view"):
        times, jit_times = [], []
        for _ in range(reps + 1):
            t0 = time.perf_counter()
            y = chain(kind, x, w, n)
            t1 = time.perf_counter()
            xla_dtensor.sync()
            del y
            times.append((t1 - t0) / n * 1e6)
        xs, ws = jax.numpy.asarray(x.cpu().numpy()), jax.numpy.asarray(w.cpu().numpy())

        def jf(a, b, kind=kind):
            y = a
            for _ in range(n):
                y = y + a if kind == "add" else (y @ b if kind == "mm" else a.reshape(64).reshape(8, 8))
            return y
        f = jax.jit(jf)
        f(xs, ws).block_until_ready()
        for _ in range(reps):
            t0 = time.perf_counter()
            r = f(xs, ws)
            jit_times.append((time.perf_counter() - t0) / n * 1e6)
            r.block_until_ready()
        out[kind] = (statistics.median(times[1:]), statistics.median(jit_times))
    return out


def bench_gpt2(reps: int) -> tuple[float, float]:
    dev = xla_dtensor.device()
    torch.manual_seed(0)
    model = GPT2(GPT2Config(vocab=128, n_positions=32, n_embd=64, n_layer=2, n_head=4)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 128, (4, 32))
    seen = _capture_program()
    host = []
    for i in range(reps + 3):
        xla_dtensor.wait()
        t0 = time.perf_counter()
        d = idx.to(dev)
        loss = model(d, d)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        host.append((time.perf_counter() - t0) * 1e3)
    seen[0] = True
    d = idx.to(dev)
    model(d, d).backward()
    opt.step()
    opt.zero_grad()
    xla_dtensor.sync()
    compiled = executor._CACHE[next(reversed(executor._CACHE))]
    args = seen[1]
    jit_host = []
    # the same compiled step called directly (what a traced-once replay would cost), no donation reuse
    for _ in range(reps):
        fresh = [jax.numpy.array(a, copy=True) if isinstance(a, jax.Array) else a for a in args]
        jax.block_until_ready(fresh)
        t0 = time.perf_counter()
        r = compiled(*fresh)
        jit_host.append((time.perf_counter() - t0) * 1e3)
        jax.block_until_ready(r)
    return statistics.median(host[3:]), statistics.median(jit_host)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    a = ap.parse_args()
    ops = bench_ops(a.n, a.reps)
    print(f"{'op':<6}{'lazy us/op':>12}{'jax.jit us/op':>15}{'ratio':>8}")
    for k, (lazy, jit) in ops.items():
        print(f"{k:<6}{lazy:>12.2f}{jit:>15.3f}{lazy / jit:>8.1f}")
    step, jstep = bench_gpt2(a.reps)
    print(f"GPT-2 (2 layers, n_embd 64, batch 4x32) host ms/step: lazy {step:.1f}, "
          f"compiled step called directly {jstep:.2f}, ratio {step / jstep:.0f}")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    kinds = list(ops)
    ax[0].bar([i - 0.2 for i in range(3)], [ops[k][0] for k in kinds], 0.4, label="lazy core")
    ax[0].bar([i + 0.2 for i in range(3)], [ops[k][1] for k in kinds], 0.4, label="jax.jit")
    ax[0].set_xticks(range(3), kinds)
    ax[0].set_ylabel("host us / op")
    ax[0].axhline(20, ls="--", c="gray", lw=0.8)
    ax[0].legend()
    ax[1].bar(["lazy step", "compiled call"], [step, jstep])
    ax[1].set_ylabel("host ms / GPT-2 step")
    fig.tight_layout()
    fig.savefig("trace_overhead.png", dpi=120)
    print("saved trace_overhead.png")


if __name__ == "__main__":
    main()
