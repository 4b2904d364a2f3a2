"""Measure the alpha-beta link model and roofline of this host's virtual CPU devices.

The ``cpu`` preset in :mod:`mesh.presets` is what the auto-sharder plans with on
virtual devices; this benchmark is its source. It times, on the 8 virtual devices:

* all-reduce (``psum`` under ``shard_map``) over 2, 4 and 8 devices for message sizes
  from 4 KiB to 16 MiB, and fits ``t = alpha + 2 (n-1)/n * beta * B`` by least squares;
* a batched matmul on every device at once (per-device flop/s while all 8 share the cores);
* an elementwise update on every device at once (per-device bytes/s).

Prints medians and the fit, saves ``benchmarks/results/calibrate_cpu.{md,png}``.
Usage: ``PYTHONPATH=. python benchmarks/calibrate_cpu.py [--reps 15]``
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import mesh  # noqa: F401  (virtual CPU devices before JAX starts)

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from mesh import Mesh

RESULTS = Path(__file__).parent / "results"


def _median_time(fn, *args, reps: int) -> float:  # noqa: ANN001
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def all_reduce_times(reps: int) -> list[tuple[int, int, float]]:
    """(devices n, bytes per device B, median seconds) for psum over n of 8 devices."""
    rows = []
    for n in (2, 4, 8):
        jm = Mesh(range(8), (8 // n, n), ("rest", "ring")).jax_mesh()
        for nbytes in (4 << 10, 64 << 10, 1 << 20, 4 << 20, 16 << 20):
            per = nbytes // 4
            x = jax.device_put(jnp.ones((8 * per,), jnp.float32), NamedSharding(jm, P(("rest", "ring"))))
            f = jax.jit(jax.shard_map(lambda a: jax.lax.psum(a, "ring"), mesh=jm,
                                      in_specs=P(("rest", "ring")), out_specs=P(("rest", "ring"))))
            rows.append((n, nbytes, _median_time(f, x, reps=reps)))
            print(f"  all-reduce n={n} {nbytes >> 10:6d} KiB: {rows[-1][2] * 1e3:8.3f} ms", flush=True)
    return rows


def fit_alpha_beta(rows: list[tuple[int, int, float]]) -> tuple[float, float]:
    """Fit t = alpha + beta * 2 (n-1)/n * B minimizing relative error; both kept positive.

    NOTE: relative (1/t-weighted) error, so the latency-bound small messages count as
    much as the bandwidth-bound large ones; plain least squares ignores alpha.
    """
    a = np.array([[1.0, 2 * (n - 1) / n * b] for n, b, _ in rows])
    t = np.array([s for _, _, s in rows])
    (alpha, beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return max(alpha, 1e-7), max(beta, 1e-13)


def per_device_flops(reps: int) -> float:
    jm = Mesh(range(8), (8,), ("d",)).jax_mesh()
    k = 256
    x = jax.device_put(jnp.ones((8 * 4, k, k), jnp.float32), NamedSharding(jm, P("d")))
    t = _median_time(jax.jit(lambda a: a @ a), x, reps=reps)
    return 4 * 2 * k**3 / t  # each device multiplies 4 (k x k) pairs, all devices at once


def per_device_bandwidth(reps: int) -> float:
    jm = Mesh(range(8), (8,), ("d",)).jax_mesh()
    n = 4 << 20  # floats per device
    x = jax.device_put(jnp.ones((8 * n,), jnp.float32), NamedSharding(jm, P("d")))
    t = _median_time(jax.jit(lambda a: a * 1.5 + 1.0), x, reps=reps)
    return 2 * 4 * n / t  # read + write per device


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    args = ap.parse_args()
    print("measuring all-reduce on the virtual devices ...", flush=True)
    rows = all_reduce_times(args.reps)
    alpha, beta = fit_alpha_beta(rows)
    flops, bw = per_device_flops(args.reps), per_device_bandwidth(args.reps)
    lines = ["# Virtual CPU device calibration", "",
             f"{len(jax.devices())} devices, jax {jax.__version__}; medians of {args.reps}.", "",
             "| devices | bytes/device | measured ms | model ms |", "|---|---|---|---|"]
    for n, b, s in rows:
        model = alpha + 2 * (n - 1) / n * beta * b
        lines.append(f"| {n} | {b >> 10} KiB | {s * 1e3:.3f} | {model * 1e3:.3f} |")
    lines += ["", f"fit: alpha = {alpha * 1e6:.1f} us, beta = {beta * 1e9:.3f} ns/byte "
              f"({1 / beta / 1e9:.2f} GB/s)",
              f"per-device matmul: {flops / 1e9:.2f} GFLOP/s; per-device memory: {bw / 1e9:.2f} GB/s "
              "(all 8 devices busy at once)"]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "calibrate_cpu.md").write_text(text)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in (2, 4, 8):
            pts = [(b, s) for m, b, s in rows if m == n]
            xs = [b for b, _ in pts]
            ax.loglog(xs, [s * 1e3 for _, s in pts], "o", label=f"measured, {n} devices")
            ax.loglog(xs, [(alpha + 2 * (n - 1) / n * beta * b) * 1e3 for b in xs], "-", alpha=0.6)
        ax.set_xlabel("bytes per device")
        ax.set_ylabel("all-reduce ms")
        ax.set_title("virtual CPU devices: measured vs alpha-beta fit")
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "calibrate_cpu.png", dpi=110)
    except ImportError:
        print("matplotlib not installed: no plot (pip install .[bench])")


if __name__ == "__main__":
    main()
