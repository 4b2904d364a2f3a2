"""Child process of tests/docs/test_docs.py: run the doc blocks, print one JSON line per block.

``python tests/docs/_doc_runner.py fast|slow RESULTS.jsonl [ONLY [CLAIMS]]`` runs every page in
order in one interpreter; the blocks of a page share one namespace, as if pasted into one Python
session. ``fast`` leaves out slow and skipped blocks; ``slow`` runs the pages that have
slow blocks (every block of such a page, to rebuild its session) and reports only the
slow ones. ``ONLY``: only the pages whose path contains it. ``CLAIMS``: a folder shared by
runners started at once: each page runs in the runner that claims it first (a file per page,
created exclusively), so they split the pages. Each result: ``{"id", "status": pass|fail|skip, "detail", "seconds"}``.
"""
from __future__ import annotations

import ast
import contextlib
import doctest
import io
import json
import os
import runpy
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _doc_blocks import ROOT, Block, all_blocks  # noqa: E402

_FLAGS = doctest.ELLIPSIS
_CHECK = doctest.OutputChecker()
_PY_PREFIXES = ("python3 ", "python ", ".venv/bin/python ", ".venv/bin/python3 ")
# Commands that install packages or run the test suite (which runs this runner) must be
# marked skip; running them here would recurse or change the environment.
_REFUSED = ("dev.py", "pip ", "pytest", "_doc_runner")
_NESTED = "XLA_DTENSOR_DOCS_RUNNER"


def _same(want: str, got: str) -> bool:
    """Equal after stripping trailing spaces per line; ``...`` matches anything (doctest ELLIPSIS)."""
    norm = lambda s: "\n".join(ln.rstrip() for ln in s.strip("\n").splitlines()) + "\n"  # noqa: E731
    return _CHECK.check_output(norm(want), norm(got), _FLAGS)


def _diff(want: str, got: str) -> str:
    return f"expected:\n{want.rstrip()}\ngot:\n{got.rstrip()}"


def _run_doctest(b: Block, ns: dict) -> str:
    test = doctest.DocTestParser().get_doctest(b.text, ns, b.id, str(ROOT / b.page), b.line)
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    report = io.StringIO()
    runner.run(test, out=report.write, clear_globs=False)
    ns.update(test.globs)  # DocTest works on a copy of the namespace
    return report.getvalue() if runner.failures else ""


def _expected(source_line: str) -> str | None:
    """The ``# -> value`` comment of a line, if any."""
    if "# ->" not in source_line:
        return None
    return source_line.split("# ->", 1)[1].strip()


def _run_python(b: Block, ns: dict) -> str:
    lines = b.text.splitlines()
    tree = ast.parse(b.text, filename=b.page)
    out = io.StringIO()
    problems = []
    with contextlib.redirect_stdout(out):
        for stmt in tree.body:
            want = _expected(lines[stmt.end_lineno - 1]) if isinstance(stmt, ast.Expr) else None
            ast.increment_lineno(stmt, b.line)  # tracebacks name the line of the page
            if want is None:
                exec(compile(ast.Module([stmt], []), str(ROOT / b.page), "exec"), ns)
                continue
            got = repr(eval(compile(ast.Expression(stmt.value), str(ROOT / b.page), "eval"), ns))
            if not _same(want, got):
                problems.append(f"line {stmt.lineno}: {_diff(want, got)}")
    if b.output is not None and not _same(b.output, out.getvalue()):
        problems.append(f"printed output: {_diff(b.output, out.getvalue())}")
    return "\n".join(problems)


def _plain(cmd: str) -> bool:
    """No shell operator, expansion or redirection outside single quotes."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    try:
        tokens = list(lex)
    except ValueError:  # unbalanced quotes
        return False
    unquoted = cmd.split("'")[::2]  # text outside single quotes
    return (not any(t and set(t) <= set("();<>|&") for t in tokens)
            and not any("$" in u or "`" in u for u in unquoted))


def _command(cmd: str, env: dict) -> tuple[int, str]:
    """Run one shell command. ``python -m MOD ARGS`` runs in this interpreter (same program,
    no second start-up); anything else goes to bash."""
    if any(word in cmd for word in _REFUSED):
        return 1, (f"refused to run {cmd!r}: it installs packages or runs the test suite; "
                   "mark the block <!-- docs-test: skip REASON -->")
    for prefix in _PY_PREFIXES:
        if cmd.startswith(prefix + "-m ") and _plain(cmd):
            argv = shlex.split(cmd[len(prefix) + 3:])
            out, saved = io.StringIO(), sys.argv
            sys.argv = argv
            code = 0
            try:
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            finally:
                sys.argv = saved
            return code, out.getvalue()
    for prefix in _PY_PREFIXES:
        if cmd.startswith(prefix):
            cmd = f"{shlex.quote(sys.executable)} {cmd[len(prefix):]}"
    proc = subprocess.run(["bash", "-c", cmd], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout + proc.stderr


def _run_console(b: Block, env: dict) -> str:
    problems, cmd, want = [], None, []
    for line in b.text.splitlines() + ["$ "]:
        if line.startswith("$ ") or line == "$":
            if cmd:
                code, got = _command(cmd, env)
                if code != 0:
                    problems.append(f"$ {cmd}\nexit code {code}:\n{got[-3000:]}")
                elif want and not _same("\n".join(want), got):
                    problems.append(f"$ {cmd}\n{_diff(chr(10).join(want), got)}")
            cmd, want = line[2:].strip(), []
        else:
            want.append(line)
    return "\n\n".join(problems)


def _run_shell(b: Block, env: dict) -> str:
    problems = []
    for cmd in (ln.strip() for ln in b.text.splitlines()):
        if cmd and not cmd.startswith("#"):
            code, got = _command(cmd.split(" #")[0].strip(), env)
            if code != 0:
                problems.append(f"$ {cmd}\nexit code {code}:\n{got[-3000:]}")
    return "\n\n".join(problems)


def run_block(b: Block, ns: dict, env: dict) -> tuple[str, str]:
    kind = b.kind
    if kind in ("text", "unlabelled"):
        return "skip", kind
    try:
        problem = {"doctest": lambda: _run_doctest(b, ns), "python": lambda: _run_python(b, ns),
                   "console": lambda: _run_console(b, env), "shell": lambda: _run_shell(b, env)}[kind]()
    except BaseException:  # noqa: BLE001 - the block's own error is the result
        return "fail", traceback.format_exc(limit=-8)
    return ("fail", problem) if problem else ("pass", "")


def _as_python_at_the_root() -> None:
    """Like ``python`` started in the repository root: the root first on ``sys.path``; and
    the test suite's torchvision fix (its C++ ops do not load on CPU torch, which breaks
    ``import transformers``/``timm``), loaded by path, as tests/integration does."""
    sys.path.insert(0, str(ROOT))
    shim = ROOT / "benchmarks" / "models" / "torchvision_shim.py"
    if shim.exists():
        import importlib.util
        spec = importlib.util.spec_from_file_location("_docs_torchvision_shim", shim)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # its Library objects must outlive this call
        spec.loader.exec_module(module)
        module.install()


def main(tier: str, results: str, only: str = "", claims: str = "") -> None:
    if os.environ.get(_NESTED):
        raise SystemExit("the doc runner was started from a doc block; refusing to recurse")
    _as_python_at_the_root()
    from tests._parallel import claim  # the root is on the path from here
    env = dict(os.environ, **{_NESTED: "1"})
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    by_page: dict[str, list[Block]] = {}
    for b in all_blocks():
        by_page.setdefault(b.page, []).append(b)
    os.chdir(ROOT)
    sink = open(results, "w")  # noqa: SIM115 - one line per block, flushed as it goes
    for page, blocks in by_page.items():
        if (tier == "slow" and not any(b.mark == "slow" for b in blocks)) or only not in page:
            continue
        if claims and not claim(claims, page.replace("/", "__")):
            continue
        ns: dict = {"__name__": "__docs__"}
        for b in blocks:
            if b.mark == "skip" or (tier == "fast" and b.mark == "slow"):
                continue
            t0 = time.perf_counter()
            status, detail = run_block(b, ns, env)
            if tier == "fast" or b.mark == "slow":
                sink.write(json.dumps({"id": b.id, "status": status, "detail": detail,
                                       "seconds": round(time.perf_counter() - t0, 3)}) + "\n")
                sink.flush()


if __name__ == "__main__":
    main(*sys.argv[1:5])
