"""Second process of tests/integration/test_matrix.py: trains matrix cells beside the pytest process.

``python _matrix_worker.py CLAIMS RESULTS CELLS_JSON``: CELLS_JSON lists ``[model, mode]`` in the
test order; this process takes them from the end, each one it claims first (a file per cell in
CLAIMS, created exclusively; the test process claims from the start), and stops at the first cell
already claimed (from there on the test process has them all) or once the test process has gone.
Each cell is trained exactly as the test trains it (:func:`benchmarks.models.zoo_train.train` and
the CPU oracle, ``STEPS`` steps) and its outcome written to ``RESULTS/<model>__<mode>.json``; the
test makes every assertion on it. The test suite's environment (XLA flags) is inherited, with a
cache folder of its own.
"""
from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from pathlib import Path

from tests._parallel import claim

ROOT = Path(__file__).resolve().parents[2]


def key(name: str, mode: str) -> str:
    return f"{name}__{mode}"


def main(claims: Path, results: Path, cells: list[list[str]], steps: int) -> None:
    sys.path.insert(0, str(ROOT))
    from benchmarks.models.torchvision_shim import install
    install()  # timm and transformers' Mixtral import torchvision, whose C++ ops do not load on CPU torch

    import xla_dtensor  # noqa: F401  (the jax device registers before any CPU backward)
    from benchmarks.models.zoo import ZOO
    from benchmarks.models.zoo_train import train
    from xla_dtensor.core import executor

    refs: dict[str, list[float]] = {}
    parent = os.getppid()
    for name, mode in reversed(cells):
        if os.getppid() != parent or not claim(claims, key(name, mode)):  # the test process has gone, or has the rest
            return
        try:
            if name not in refs:
                refs[name] = train(ZOO[name], "cpu", steps).losses
            res = train(ZOO[name], mode, steps)
            out = {"ref": refs[name], "losses": res.losses, "compiles_after_warmup": res.compiles_after_warmup,
                   "step_ms": res.step_ms, "info": res.info}
        except BaseException:  # noqa: BLE001 - the cell's test fails with it
            out = {"error": traceback.format_exc()}
        finally:
            executor.release_executables()  # as the test process does after each cell (memory maps)
            gc.collect()
        tmp = results / (key(name, mode) + ".tmp")
        tmp.write_text(json.dumps(out, default=str))
        tmp.rename(results / (key(name, mode) + ".json"))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]))
