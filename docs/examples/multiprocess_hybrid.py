"""Two processes x 4 CPU devices: data parallel over DCN (processes), tensor parallel over ICI.

Run ``python docs/examples/multiprocess_hybrid.py --out DIR``: it starts 2 worker
processes on this machine (gloo CPU collectives, coordinator on 127.0.0.1 at a free
port), each trains a small MLP for a few steps on a
``HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1))`` and writes its losses and
final parameters to ``DIR/result{process}.pt``.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time

STEPS, BATCH, LR = 4, 8, 0.1
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_model_and_data():
    """The model (seeded) and the global batches every process (and the reference) uses."""
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    g = torch.Generator().manual_seed(1)
    data = [(torch.randn(BATCH, 8, generator=g), torch.randn(BATCH, 4, generator=g)) for _ in range(STEPS)]
    return model, data


def worker(process_id: int, port: int, out: str) -> None:
    import xla_dtensor  # noqa: F401  (before jax starts: XLA_FLAGS from the environment)
    from xla_dtensor.runtime import initialize_distributed
    initialize_distributed(f"127.0.0.1:{port}", 2, process_id)

    import torch
    from torch.distributed.tensor import Replicate, Shard

    import xla_dtensor.spmd as xs
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    assert mesh.axis_kind("dcn") == "dcn" and mesh.axis_kind("ici") == "ici"
    model, data = make_model_and_data()
    placements = {"0.weight": [Replicate(), Shard(0)], "0.bias": [Replicate(), Shard(0)],
                  "2.weight": [Replicate(), Shard(1)], "2.bias": [Replicate(), Replicate()]}
    for name, p in list(model.named_parameters()):
        mod_name, attr = name.rsplit(".", 1)
        sharded = xla_dtensor.distribute_tensor(p.detach(), mesh, placements[name])
        model.get_submodule(mod_name).register_parameter(attr, torch.nn.Parameter(sharded))
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for x, y in data:
        xb = xla_dtensor.distribute_tensor(x, mesh, [Shard(0), Replicate()])   # batch over DCN
        yb = xla_dtensor.distribute_tensor(y, mesh, [Shard(0), Replicate()])
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad()
        xla_dtensor.sync()
        losses.append(float(xs.to_host(loss)))
    params = {n: torch.from_numpy(xs.to_host(p.detach()).copy()) for n, p in model.named_parameters()}
    torch.save({"losses": losses, "params": params}, os.path.join(out, f"result{process_id}.pt"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: str, timeout: float = 120.0) -> None:
    """Start the two workers and wait (bounded); kill both if either fails or hangs."""
    port = _free_port()
    env = dict(os.environ, XLA_DTENSOR_CPU_DEVICES="4",
               XLA_FLAGS="--xla_force_host_platform_device_count=4",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), JAX_PLATFORMS="cpu")
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker", str(i),
                               "--port", str(port), "--out", out], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for i in range(2)]
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        logs = [p.communicate()[0].decode(errors="replace") for p in procs]
    bad = [(i, p.returncode) for i, p in enumerate(procs) if p.returncode != 0]
    if bad:
        raise RuntimeError(f"workers failed or timed out after {timeout}s: {bad}\n"
                           + "\n".join(f"--- worker {i} ---\n{log[-3000:]}" for i, log in enumerate(logs)))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", type=int)
    ap.add_argument("--port", type=int)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.worker is None:
        os.makedirs(a.out, exist_ok=True)
        launch(a.out)
        print("ok: results in", a.out)
    else:
        worker(a.worker, a.port, a.out)
