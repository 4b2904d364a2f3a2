"""Jobs the zygote (``_zygote.py``) runs in forked children; each reports through files or ``RESULT`` lines.

The expected values are functions of their arguments only (``generation_values``,
``mp_values``), so the test process checks what a job left behind against them.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import time

import numpy as np
import torch

SAVE_SHAPES = {"w": (256, 128), "u": (300, 100), "r": (1000,), "bf": (128, 64), "c": (100,)}


def generation_values(gen: int) -> dict[str, torch.Tensor]:
    """The tensors of save generation ``gen``: a position pattern plus ``1000 * gen`` (a mix shows)."""
    out = {}
    for k, shape in SAVE_SHAPES.items():
        n = int(np.prod(shape))
        out[k] = (torch.arange(n, dtype=torch.float32) % 997 + 1000.0 * gen).reshape(shape)
    out["bf"] = (torch.arange(int(np.prod(SAVE_SHAPES["bf"]))) % 7 + gen % 50).reshape(SAVE_SHAPES["bf"]).to(torch.bfloat16)
    return out


def save_loop(path: str, ready_file: str, first_gen: int, exchange: bool = True) -> None:
    """Save generations first_gen, first_gen + 1, ... to ``path`` until killed."""
    from torch.distributed.tensor import Replicate, Shard

    import xla_dtensor
    from mesh import Mesh
    from xla_dtensor import checkpoint
    from xla_dtensor.checkpoint import publish
    if not exchange:
        publish._exchange = lambda a, b: False  # the two-rename path (file systems without renameat2)
    mesh = Mesh(range(8), (2, 4), ("a", "b"))
    layouts = {"w": [Shard(0), Shard(1)], "u": [Shard(0), Replicate()], "r": [Replicate(), Replicate()],
               "bf": [Replicate(), Shard(1)]}
    gen = first_gen
    while True:
        vals = generation_values(gen)
        sd = {k: xla_dtensor.distribute_tensor(v, mesh, layouts[k]) if k in layouts else v for k, v in vals.items()}
        sd["meta"] = {"gen": gen}
        print(f"saving {gen}", flush=True)
        checkpoint.save(sd, path)
        print(f"saved {gen}", flush=True)
        if gen == first_gen:
            open(ready_file, "w").close()
        gen += 1


def compile_cache(cache_dir: str, out: str) -> None:
    """Run a few programs with ``cache_dir`` as the persistent compile cache; save results and cache hits."""
    import xla_dtensor
    from xla_dtensor import metrics
    from xla_dtensor.runtime import initialize_cache
    assert initialize_cache(cache_dir)
    dev = xla_dtensor.device()
    g = torch.Generator().manual_seed(0)
    results = {}
    for n in (8, 24):
        a, b = torch.randn(n, n, generator=g), torch.randn(n, 4, generator=g)
        y = torch.tanh(a.to(dev) @ b.to(dev)) * 2 + 1
        results[f"n{n}"] = y.cpu().numpy()
    np.savez(out, hits=metrics._COUNTS.get("persistent_cache_hits", 0),
             rejected=metrics._COUNTS.get("persistent_cache_rejected", 0), **results)


def plan_cache(cache_dir: str, writer: int, rounds: int, out: str) -> None:
    """Put and get plans under 8 shared keys; count reads that are neither absent nor a whole written plan."""
    import warnings

    from autoshard.cache import PlanCache
    from autoshard.plan import Plan
    cache = PlanCache(cache_dir)
    bad, seen, warned = [], 0, 0
    for i in range(rounds):
        key = f"k{i % 8}"
        cache.put(key, Plan(mesh_axes=("d",), mesh_shape=(i % 8 + 1,), topology=f"writer{writer}"))
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = cache.get(f"k{(i + 3) % 8}")
        warned += len(w)
        if got is not None:
            seen += 1
            if got.mesh_shape != ((i + 3) % 8 + 1,) or not got.topology.startswith("writer"):
                bad.append(repr(got)[:200])
    with open(out, "w") as f:
        json.dump({"bad": bad, "seen": seen, "warned": warned}, f)


def peer(me: int, port: int, scenario: str, timeout: float) -> None:
    """One process of a 2-process job: ``victim-dies`` (process 1 is killed mid-training), ``root-dies``
    (process 0, the coordination service, is), ``alone``."""
    from xla_dtensor.runtime import PeerFailureError, initialize_distributed
    t0 = time.time()
    try:
        initialize_distributed(f"127.0.0.1:{port}", 2, me, peer_timeout=timeout, init_timeout=timeout)
    except PeerFailureError as err:
        print(f"RESULT PeerFailureError missing={list(err.missing)} at={time.time() - t0:.2f}s msg={err}", flush=True)
        sys.exit(3)
    from jax._src import distributed
    if me == 0 and hasattr(distributed.global_state.service, "pid"):  # XLA_DTENSOR_SERVICE_PROCESS=0: no helper
        print(f"RESULT service helper pid={distributed.global_state.service.pid}", flush=True)
    from torch.distributed.tensor import Replicate, Shard

    import xla_dtensor
    import xla_dtensor.spmd as xs
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    w = xla_dtensor.distribute_tensor(torch.ones(8, 4), mesh, [Shard(0), Replicate()])
    died = None
    try:
        for step in range(100_000):
            if step == 3:
                died = time.time()
                print(f"RESULT step3 at {died:.3f}", flush=True)
                if scenario == "victim-dies" and me == 1 or scenario == "root-dies" and me == 0:
                    os.kill(os.getpid(), signal.SIGKILL)
            w = w * 1.0 + 0.0
            float(xs.to_host(w.sum()))  # a cross-process reduction every step
            time.sleep(0.02)
    except PeerFailureError as err:
        print(f"RESULT PeerFailureError missing={list(err.missing)} after={time.time() - died:.2f}s msg={err}",
              flush=True)
        sys.exit(3)
    except Exception as err:  # anything else a survivor might get: reported, so the test shows it
        print(f"RESULT {type(err).__name__}: {str(err)[:300]}", flush=True)
        sys.exit(4)


def mp_values() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    return {"w": torch.randn(8, 12, generator=g), "u": torch.randn(10, 3, generator=g),
            "r": torch.randn(6, generator=g), "bf": torch.randn(4, 8, generator=g).to(torch.bfloat16)}


def mp_checkpoint(me: int, port: int, path: str, phase: str, timeout: float = 60.0) -> None:
    """2 processes x 4 devices: ``save`` a sharded state dict, ``load`` it into another layout and
    check this process's shards, or ``save-without-1`` (process 1 never saves)."""
    from xla_dtensor.runtime import initialize_distributed
    initialize_distributed(f"127.0.0.1:{port}", 2, me, peer_timeout=20, init_timeout=60)
    from torch.distributed.tensor import Replicate, Shard

    import xla_dtensor
    import xla_dtensor.spmd as xs
    from xla_dtensor import checkpoint
    from xla_dtensor.core.executor import materialize
    mesh = xs.HybridMesh(ici_mesh_shape=(1, 4), dcn_mesh_shape=(2, 1), axis_names=("dcn", "ici"))
    vals = mp_values()
    if phase in ("save", "save-without-1"):
        layouts = {"w": [Shard(0), Shard(1)], "u": [Shard(0), Replicate()], "r": [Replicate(), Replicate()],
                   "bf": [Replicate(), Shard(1)]}
        sd = {k: xla_dtensor.distribute_tensor(v, mesh, layouts[k]) for k, v in vals.items()}
        sd["meta"] = {"step": 5}
        if phase == "save-without-1" and me == 1:
            print("RESULT process 1 skips the save", flush=True)
            return
        try:
            checkpoint.save(sd, path, timeout=timeout)
        except checkpoint.CheckpointError as err:
            print(f"RESULT CheckpointError {err}", flush=True)
            sys.exit(5)
        print("RESULT saved", flush=True)
        return
    layouts = {"w": [Replicate(), Shard(0)], "u": [Replicate(), Shard(0)], "r": [Shard(0), Replicate()],
               "bf": [Shard(0), Replicate()]}
    tgt = {k: xla_dtensor.distribute_tensor(torch.zeros_like(v), mesh, layouts[k]) for k, v in vals.items()}
    tgt["meta"] = {"step": 0}
    checkpoint.load(tgt, path)
    bad = []
    for k, v in vals.items():
        arr = materialize(tgt[k])
        for sh in arr.addressable_shards:
            want = v[tuple(slice(s.start, s.stop) for s in sh.index)] if v.dim() else v
            got = torch.from_numpy(np.asarray(sh.data).astype(np.float32)).to(v.dtype)
            if not torch.equal(got, want):
                bad.append((k, str(sh.index)))
    print(f"RESULT loaded bad={bad} step={tgt['meta']['step']} shards={len(arr.addressable_shards)}", flush=True)
