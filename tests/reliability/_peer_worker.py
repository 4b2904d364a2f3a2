"""One process of a 2-process job for the peer-failure tests (run by test_peer_failure.py).

``python _peer_worker.py PROCESS PORT SCENARIO PEER_TIMEOUT``; prints one ``RESULT ...``
line. Scenarios: ``victim-dies`` (process 1 kills itself mid-training; process 0
reports what it got), ``alone`` (only this process starts), ``clean`` (both finish).
"""
from __future__ import annotations

import os
import signal
import sys
import time

import xla_dtensor  # noqa: F401  (before jax starts: XLA_FLAGS from the environment)
from xla_dtensor.runtime import PeerFailureError, initialize_distributed


def main() -> None:
    me, port, scenario, timeout = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    t0 = time.monotonic()
    try:
        initialize_distributed(f"127.0.0.1:{port}", 2, me, peer_timeout=timeout, init_timeout=timeout)
    except PeerFailureError as err:
        print(f"RESULT PeerFailureError missing={list(err.missing)} after={time.monotonic() - t0:.1f} msg={err}",
              flush=True)
        sys.exit(3)
    import torch
    from torch.distributed.tensor import Replicate, Shard

    import xla_dtensor.spmd as xs
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    w = xla_dtensor.distribute_tensor(torch.ones(8, 4), mesh, [Shard(0), Replicate()])
    try:
        for step in range(10_000):
            if scenario == "victim-dies" and me == 1 and step == 3:
                print(f"RESULT victim dies at {time.time():.2f}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            w = w * 1.0 + 0.0
            total = float(xs.to_host(w.sum()))  # a cross-process reduction every step
            if scenario == "clean" and step == 5:
                print(f"RESULT clean total={total}", flush=True)
                return
            time.sleep(0.05)
    except PeerFailureError as err:
        print(f"RESULT PeerFailureError missing={list(err.missing)} at={time.time():.2f} msg={err}", flush=True)
        sys.exit(3)
    except Exception as err:  # what a survivor gets instead: reported, so the test shows it
        print(f"RESULT {type(err).__name__}: {str(err)[:300]}", flush=True)
        sys.exit(4)


if __name__ == "__main__":
    main()
