"""Bad command-line input: one line on stderr, exit code 2, never a traceback (issue 21, item 3).

The table runs in one child interpreter (each CLI's ``main`` with stderr captured, so
an exception other than ``SystemExit`` shows up as a traceback); a few cases also run
as real processes (``python -m ...``) to check the exit code the shell sees. These processes start
when collection ends, in the background (tests/_parallel.py).
"""
from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import _parallel
from tests._parallel import Results

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = {"problem": {"name": "t", "nodes": {"intervals": [[0, 2], [1, 3]], "costs": [[1, 2], [2, 3]],
                                             "usages": [[1, 2], [3, 4]]},
                       "edges": {"nodes": [[0, 1]], "costs": [[0, 5, 6, 7]]}, "usage_limit": 10}}
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--vocab", "64", "--batch", "8", "--seq", "8",
        "--quiet"]


def _unwritable_folder(tmp: Path) -> Path:
    if os.geteuid() == 0:  # root writes anywhere that is mounted read-write
        return Path("/proc/sys")
    folder = tmp / "readonly"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


def _cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(cli, argv, text the error line must contain)."""
    good = tmp / "good.json"
    good.write_text(json.dumps(EXAMPLE))
    neg = json.loads(json.dumps(EXAMPLE))
    neg["problem"]["nodes"]["costs"][0][1] = -1e30
    (tmp / "neg.json").write_text(json.dumps(neg))
    rev = json.loads(json.dumps(EXAMPLE))
    rev["problem"]["nodes"]["intervals"][1] = [3, 1]
    (tmp / "rev.json").write_text(json.dumps(rev))
    (tmp / "junk.json").write_text("{not json")
    (tmp / "junk.json.gz").write_bytes(b"not gzip at all")
    plan, iop, viz = "plan", "iopddl", "visualize"
    ro = _unwritable_folder(tmp)
    return [
        # python -m autoshard plan
        (plan, ["--mesh", "2x2x2x2"], "2x2x2x2"),
        (plan, ["--mesh", "1x1x2x4"], "drop size-1 axes (2x4)"),
        (plan, ["--mesh", "0x4"], "0x4"),
        (plan, ["--mesh", "2by4"], "2by4"),
        (plan, ["--mesh", "2x40000x4"], "320000 devices"),
        (plan, ["--time-limit", "0"], "'0'"),
        (plan, ["--time-limit", "-5"], "'-5'"),
        (plan, ["--time-limit", "nan"], "'nan'"),
        (plan, ["--time-limit", "inf"], "'inf'"),
        (plan, ["--dcn", "0"], "'0'"),
        (plan, ["--mesh", "2x4", "--dcn", "3"], "--dcn: 3"),
        (plan, ["--json", str(tmp / "missing" / "plan.json")], "does not exist"),
        (plan, ["--json", str(tmp)], "is a directory"),
        (plan, ["--json", str(good / "plan.json")], "is not a folder"),
        (plan, ["--json", str(ro / "plan.json")], "not writable"),
        (plan, ["--layers", "0"], "'0'"),
        (plan, ["--layers", "two"], "'two'"),
        (plan, ["--heads", "5"], "multiple of --heads 5"),
        (plan, ["--d-model", "-1"], "'-1'"),
        (plan, ["--vocab", "0"], "'0'"),
        (plan, ["--batch", "0"], "'0'"),
        (plan, ["--seq", "0"], "'0'"),
        (plan, ["--topology", "tpu-v9"], "tpu-v9"),
        (plan, ["--memory-gib", "0"], "'0'"),
        (plan, ["--memory-gib", "nan"], "'nan'"),
        (plan, ["--rows", "-1"], "'-1'"),
        (plan, ["--model", "bert"], "bert"),
        (plan, ["--max-pairs", "0"], "'0'"),
        (plan, ["--frobnicate"], "--frobnicate"),
        (plan, [*TINY, "--memory-gib", "1e-9"], "memory budget"),
        (plan, [*TINY, "--mesh", "2x2x2", "--max-pairs", "10"], "--max-pairs 10"),
        ("autoshard", [], "required"),
        ("autoshard", ["deploy"], "deploy"),
        # python -m autoshard iopddl
        (iop, [str(tmp / "absent.json")], "absent.json"),
        (iop, [str(tmp)], "is a directory"),
        (iop, [str(good), "--time-limit", "0"], "'0'"),
        (iop, [str(good), "--solver", "gurobi"], "gurobi"),
        (iop, [str(good), "--max-gib", "-1"], "'-1'"),
        (iop, [str(good), "--workers", "0"], "'0'"),
        (iop, [str(good), "--max-gib", "1e-7"], "larger than the limit"),
        (iop, [str(tmp / "junk.json")], "not valid JSON"),
        (iop, [str(tmp / "junk.json.gz")], "cannot read"),
        (iop, [str(tmp / "neg.json")], "-1e+30"),
        (iop, [str(tmp / "rev.json")], "[3, 1]"),
        # python -m xla_dtensor.visualize
        (viz, ["{devices=[2,4]<=[8]}", "--shape", "0,4"], "0,4"),
        (viz, ["{devices=[2,4]<=[8]}", "--shape", "a,b"], "a,b"),
        (viz, ["{devices=[2,4]<=[8]}"], "--shape"),
        (viz, ["garbage(", "--shape", "4,4"], "garbage("),
        (viz, ["('dp', None)", "--shape", "4,4", "--mesh", "2,4", "--names", "dp"], "'dp'"),
        (viz, ["('dp', None)", "--shape", "4,4", "--names", "dp,tp"], "need --mesh"),
        (viz, ["{devices=[2,4]<=[8]}", "--shape", "4,4", "--dims", "0,5"], "0,5"),
        (viz, ["{devices=[2,4]<=[8]}", "--shape", "4,4", "--width", "0"], "'0'"),
        (viz, ["('dp', None)", "--shape", "4,4", "--mesh", "2,4", "--dcn", "3,1"], "3,1"),
        (viz, ["{devices=[2,4]<=[7]}", "--shape", "4,4"], "7"),
        (viz, ["('zz', None)", "--shape", "4,4", "--mesh", "2,4", "--names", "dp,tp"], "zz"),
    ]


_DRIVER = """
import contextlib, io, json, sys, time, traceback
from autoshard.__main__ import main as autoshard_main
from xla_dtensor.visualize import main as visualize_main
entry = {"plan": lambda a: autoshard_main(["plan", *a]), "iopddl": lambda a: autoshard_main(["iopddl", *a]),
         "autoshard": autoshard_main, "visualize": visualize_main}
for cli, argv in json.loads(sys.stdin.read()):
    err, out, t0 = io.StringIO(), io.StringIO(), time.perf_counter()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = entry[cli](argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException:
            code = "traceback"
            traceback.print_exc(file=err)
    print(json.dumps({"code": code, "err": err.getvalue(), "s": time.perf_counter() - t0}), flush=True)

import argparse
from autoshard.__main__ import parser
from xla_dtensor.visualize import _parser
subs = [a for a in parser()._actions if isinstance(a, argparse._SubParsersAction)][0].choices
for name, p in [("plan", subs["plan"]), ("iopddl", subs["iopddl"]), ("visualize", _parser())]:
    text = " ".join(p.format_help().split())
    for a in p._actions:
        if not isinstance(a, argparse._HelpAction):
            print("HELP", json.dumps({"cli": name, "option": a.dest, "help": a.help or "",
                                      "default": repr(a.default), "choices_listed": a.choices is None or
                                      all(str(c) in text for c in a.choices)}))
"""


def _env(tmp: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(ROOT), XLA_DTENSOR_CACHE_DIR=str(tmp / "cache"))


REAL = [
    (["-m", "autoshard", "plan", "--time-limit", "nan"], "'nan'"),
    (["-m", "autoshard.solver.iopddl", "absent.json"], "absent.json"),
    (["-m", "xla_dtensor.visualize", "{devices=[2,4]<=[8]}", "--shape", "0"], "'0'"),
]
IOPDDL = [["-m", "autoshard", "iopddl"], ["-m", "autoshard.solver.iopddl"]]


def _table() -> tuple[list, list[dict], list[dict]]:
    """Run every case (and the --help survey) in one child interpreter."""
    tmp = _parallel.scratch("cli")
    cases = _cases(tmp)
    proc = _parallel.run([sys.executable, "-c", _DRIVER], input=json.dumps([c[:2] for c in cases]), cwd=ROOT,
                         env=_env(tmp), timeout=600)
    results = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    helps = [json.loads(line[5:]) for line in proc.stdout.splitlines() if line.startswith("HELP ")]
    assert len(results) == len(cases) and helps, proc.stderr[-3000:]
    return cases, results, helps


def _real(argv: list[str]) -> tuple[subprocess.CompletedProcess, float]:
    """The process's outcome and its wall seconds."""
    t0 = time.perf_counter()
    proc = _parallel.run([sys.executable, *argv], cwd=ROOT, env=_env(_parallel.scratch("cli")), timeout=120)
    return proc, time.perf_counter() - t0


def _solve_example(argv: list[str]) -> subprocess.CompletedProcess:
    tmp = _parallel.scratch("cli")
    path = tmp / "example.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(EXAMPLE, f)
    return _parallel.run([sys.executable, "-W", "error", *argv, str(path), "--time-limit", "10", "--quiet"],
                         cwd=ROOT, env=_env(tmp), timeout=120)


_JOBS = {"table": _table, **{("real", *a): lambda a=a: _real(a) for a, _ in REAL},
         **{("iopddl", *a): lambda a=a: _solve_example(a) for a in IOPDDL}}


def _needed(items: list[pytest.Item]) -> list:
    """The jobs of :data:`_JOBS` the given tests of this module read."""
    keys = []
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.originalname in ("test_bad_arguments_table", "test_help_describes_every_option"):
            keys.append("table")
        elif item.originalname == "test_real_process_exit_code_and_one_line":
            keys.append(("real", *params["argv"]))
        elif item.originalname == "test_iopddl_command_starts_without_warnings":
            keys.append(("iopddl", *params["argv"]))
    return list(dict.fromkeys(keys))


def _runs(keys: list) -> Results:
    """Each process this module's selected tests read, two at a time."""
    return Results(lambda key: _JOBS[key](), keys)


def start_early(session: pytest.Session) -> None:
    """This module's processes start when collection ends, in the background (tests/_parallel.py)."""
    keys = _needed([item for item in session.items if getattr(item, "module", None) is sys.modules[__name__]])
    _parallel.start_early(__name__, lambda: _runs(keys))


@pytest.fixture(scope="module")
def runs(request) -> Results:
    mine = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    return _parallel.early(__name__, lambda: _runs(_needed(mine)))


@pytest.fixture(scope="module")
def table(runs):
    return runs["table"]


def test_bad_arguments_table(table):
    cases, results, _ = table
    assert len(cases) >= 28
    failures = []
    for (cli, argv, must), r in zip(cases, results):
        lines = r["err"].strip().splitlines()
        ok = (r["code"] == 2 and len(lines) == 1 and "error:" in lines[0] and must in lines[0]
              and "Traceback" not in r["err"] and r["s"] < 60)
        if not ok:
            failures.append(f"{cli} {argv}: code {r['code']}, {r['s']:.1f}s, stderr {r['err'][-600:]!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("argv, must", REAL)
def test_real_process_exit_code_and_one_line(argv, must, runs):
    proc, seconds = runs[("real", *argv)]
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and must in lines[0], proc.stderr
    assert seconds < 60  # refused, not solved or hung


@pytest.mark.parametrize("argv", IOPDDL)
def test_iopddl_command_starts_without_warnings(argv, runs):
    """Issue 24: ``python -m autoshard.solver.iopddl`` printed a RuntimeWarning before anything else."""
    proc = runs[("iopddl", *argv)]
def test_help_describes_every_option(table):
    """Issue 25: every option of every CLI has a description, its default and its allowed values."""
    helps = table[2]
    assert len(helps) >= 25
    bad = [h for h in helps if not h["help"] or not h["choices_listed"]
           or (h["default"] not in ("None", "False") and "default" not in h["help"])]
    assert not bad, bad
