"""Several processes writing one plan cache and one compile cache directory at once: every read is
absent or a whole entry, every result is right (torch CPU), and a malicious plan file is not run."""
from __future__ import annotations

import json
import os
import pickle
import warnings

import numpy as np
import torch

from autoshard.cache import PlanCache, PlanCacheWarning


def test_concurrent_plan_cache_writers(zygote, tmp_path):
    cache = str(tmp_path / "plans")
    jobs = [{"fn": "plan_cache", "args": {"cache_dir": cache, "writer": w, "rounds": 300, "out": str(tmp_path / f"w{w}.json")},
             "out": str(tmp_path / f"log{w}")} for w in range(4)]
    res = zygote.run(jobs, timeout=120)
    assert all(r["rc"] == 0 for r in res), (res, [open(j["out"]).read()[-2000:] for j in jobs])
    reports = [json.load(open(tmp_path / f"w{w}.json")) for w in range(4)]
    print(f"\nplan cache: 4 writers x 300 put/get, {sum(r['seen'] for r in reports)} reads of a whole plan, "
          f"{sum(len(r['bad']) for r in reports)} wrong, {sum(r['warned'] for r in reports)} warnings")
    assert all(r["bad"] == [] and r["warned"] == 0 for r in reports), reports
    assert not [f for f in os.listdir(cache) if f.endswith(".tmp")]  # no temporary file left


def test_a_plan_file_with_a_pickle_payload_is_not_run(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (exec, (f"open({str(marker)!r}, 'w').close()",))

    cache = PlanCache(tmp_path)
    cache.path("k").write_bytes(pickle.dumps(Payload()))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert cache.get("k") is None
    assert any(issubclass(x.category, PlanCacheWarning) and "corrupted" in str(x.message) for x in w)
    assert not marker.exists()


def _oracle() -> dict[str, np.ndarray]:
    g = torch.Generator().manual_seed(0)
    out = {}
    for n in (8, 24):
        a, b = torch.randn(n, n, generator=g), torch.randn(n, 4, generator=g)
        out[f"n{n}"] = (torch.tanh(a @ b) * 2 + 1).numpy()
    return out


def test_concurrent_compile_cache_writers(zygote, tmp_path):
    cache = str(tmp_path / "xla")
    jobs = [{"fn": "compile_cache", "args": {"cache_dir": cache, "out": str(tmp_path / f"r{i}.npz")},
             "out": str(tmp_path / f"log{i}")} for i in range(2)]
    res = zygote.run(jobs, timeout=180)                       # two writers at once
    res += zygote.run([dict(jobs[0], args=dict(jobs[0]["args"], out=str(tmp_path / "reader.npz")))], timeout=120)
    assert all(r["rc"] == 0 for r in res), (res, [open(j["out"]).read()[-2000:] for j in jobs])
    want = _oracle()
    for name in ("r0", "r1", "reader"):
        got = np.load(tmp_path / f"{name}.npz")
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")
    hits = int(np.load(tmp_path / "reader.npz")["hits"])
    # every entry cut in half (what a reader meets while a writer is still writing): recompiled, still right
    entries = [os.path.join(cache, f) for f in os.listdir(cache) if not f.startswith(".")]
    for f in entries:
        os.truncate(f, os.path.getsize(f) // 2)
    res = zygote.run([dict(jobs[0], args=dict(jobs[0]["args"], out=str(tmp_path / "cut.npz")))], timeout=120)
    assert res[0]["rc"] == 0, open(jobs[0]["out"]).read()[-2000:]
    cut = np.load(tmp_path / "cut.npz")
    for k, v in want.items():
        np.testing.assert_allclose(cut[k], v, rtol=1e-5, atol=1e-5, err_msg=f"truncated cache {k}")
    print(f"\ncompile cache: 2 concurrent writers + 1 reader, all results equal torch CPU; the reader loaded "
          f"{hits} executables from the cache; with all {len(entries)} entries truncated: "
          f"{int(cut['hits'])} loaded, results still equal")
    assert hits > 0 and int(cut["hits"]) == 0


def _entries(cache: str) -> list[str]:
    return sorted(os.path.join(cache, f) for f in os.listdir(cache) if f.endswith("-cache"))


def test_swapped_or_forged_compile_cache_entries_are_recompiled_not_run(zygote, tmp_path):
    """Issue 41, item 2: an entry copied from another program's file (before: loaded and run, wrong output),
    or one whose key was rewritten to pass, is refused by its fingerprint and recompiled."""
    from xla_dtensor.runtime import open_entry, seal_entry  # noqa: F401
    cache = str(tmp_path / "xla")
    job = {"fn": "compile_cache", "args": {"cache_dir": cache, "out": str(tmp_path / "fill.npz")},
           "out": str(tmp_path / "log")}
    want = _oracle()

    def rerun(name: str) -> dict:
        res = zygote.run([dict(job, args=dict(job["args"], out=str(tmp_path / f"{name}.npz")))], timeout=120)
        assert res[0]["rc"] == 0, open(job["out"]).read()[-2000:]
        got = np.load(tmp_path / f"{name}.npz")
        for k, v in want.items():
            np.testing.assert_allclose(got[k], v, rtol=1e-5, atol=1e-5, err_msg=f"{name} {k}")
        return {"hits": int(got["hits"]), "rejected": int(got["rejected"])}

    rerun("fill")
    clean = rerun("clean")
    assert clean["hits"] > 0, clean  # the control: intact entries load
    files = _entries(cache)
    assert len(files) >= 2
    blobs = [open(f, "rb").read() for f in files]
    for f, blob in zip(files, blobs[1:] + blobs[:1]):  # every file now holds another program's entry
        open(f, "wb").write(blob)
    swapped = rerun("swapped")
    assert swapped["hits"] == 0 and swapped["rejected"] >= len(files), swapped
    assert rerun("rewritten")["hits"] > 0  # the recompiled programs replaced the swapped entries
    blobs = [open(f, "rb").read() for f in files]
    keys = [os.path.basename(f).removesuffix("-cache") for f in files]
    head = len(b"XDTC1\n") + 4
    for f, key, other_key, blob in zip(files, keys, keys[1:] + keys[:1], blobs[1:] + blobs[:1]):
        assert open_entry(other_key, blob)[0] is not None
        digest_and_payload = blob[head + len(other_key.encode()):]
        sealed_header = seal_entry(key, b"")[:head + len(key.encode())]
        open(f, "wb").write(sealed_header + digest_and_payload)  # this file's key, another program's bytes
    forged_run = rerun("forged")
    assert forged_run["hits"] == 0 and forged_run["rejected"] >= len(files), forged_run
    print(f"\ncompile cache: {len(files)} entries swapped between programs, then re-keyed: all refused "
          f"({swapped['rejected']}, {forged_run['rejected']} rejections), recompiled, results equal torch CPU")
