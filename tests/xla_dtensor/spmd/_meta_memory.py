"""Peak host memory of materializing a 256 MiB model on 8 virtual CPU devices (run as a script).

``python _meta_memory.py INIT``: meta build -> Colwise/Rowwise -> ``to_empty`` -> INIT ->
``sync()``, where INIT is ``fill`` (``weight.fill_``, ``bias.zero_``) or ``reset`` (each
``nn.Linear.reset_parameters()``: random uniform). Prints JSON: the peak RSS growth over the
RSS before the step, and the model's parameter bytes. Virtual CPU devices live in host
memory, so the shards themselves count (1x for a model sharded without replication).

Controls (the measurement can fail): ``host`` loads a state dict built whole on the host
(the checkpoint-in-memory path: 1x on the host plus the 1x of shards); ``reset_jax_random`` is ``reset`` with the random lowering
drawing through ``jax.random.uniform`` (whose CPU threefry is a rolled loop: unfused,
full-size uint32 temporaries) instead of ``xla_dtensor.ops.threefry``.

NOTE: the model is 256 MiB because compiling the init program costs a fixed ~10-20 MB of host
memory (measured: the same init a second time, from the executable cache, grows 1.004x).
"""
from __future__ import annotations

import json
import os
import resource
import sys

import jax
import torch
from torch import nn

import xla_dtensor
from xla_dtensor.core.tensor import value_of
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WIDTH, LAYERS = 4096, 4  # 4 x 4096 x 4096 float32 weights: 256 MiB (+ 64 KiB of biases)


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Start the peak RSS over from the current RSS (Linux: ``5`` to ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak() -> int:
    """This process's peak RSS: ``VmHWM`` (NOTE: not ``ru_maxrss``, which after ``exec`` starts at
    the parent's peak: a pytest parent's hundreds of MB)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _model() -> nn.Module:
    return nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])


def _plan() -> dict:
    return {str(i): ColwiseParallel() if i % 2 == 0 else RowwiseParallel() for i in range(LAYERS)}


def main(path: str) -> None:
    mesh = xla_dtensor.init_device_mesh("xla", (8,))
    warm = nn.Linear(8, 8)  # compile-free warm-up of the runtime: jax, the device, one program
    parallelize_module(warm, mesh, ColwiseParallel())
    xla_dtensor.sync()
    (warm.weight * 2).sum().item()
    if path == "reset_jax_random":
        from xla_dtensor.ops import threefry
        threefry.uniform = lambda key, shape, dtype, low=0.0, high=1.0: jax.random.uniform(key, shape, dtype, low, high)
    with torch.device("meta"):
        model = _model()
    parallelize_module(model, mesh, _plan())
    _reset_peak()
    before = _rss()
    model.to_empty(device=xla_dtensor.device())
    if path == "host":
        model.load_state_dict(_model().state_dict())  # NOTE: the whole model on the host, then its shards
    with torch.no_grad():
        for m in model:
            if path == "host":
                pass
            elif path.startswith("reset"):
                m.reset_parameters()
            else:
                m.weight.fill_(0.5)
                m.bias.zero_()
    xla_dtensor.sync()
    jax.block_until_ready([value_of(p).data for p in model.parameters()])  # NOTE: sync() returns before the program ends
    grown = _peak() - before
    nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
    w = model[0].weight
    shards = [s.data for s in w.local_shards]
    print(json.dumps({"grown": grown, "param_bytes": nbytes, "placements": str(tuple(w.placements)),
                      "std": float(torch.cat([s.flatten() for s in shards]).std()),
                      "bound": float(1 / WIDTH ** 0.5),
                      "distinct_shards": len({s.flatten()[:16].tolist().__repr__() for s in shards})}))


if __name__ == "__main__":
    main(sys.argv[1])
