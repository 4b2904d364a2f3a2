"""Tables, plots and the README splice of the auto-vs-manual benchmark.

Example:
    >>> splice("a\\n<!-- bench:start -->\\nold\\n<!-- bench:end -->\\nb", "new")
    'a\\n<!-- bench:start -->\\nnew\\n<!-- bench:end -->\\nb'
"""
from __future__ import annotations

import re
from pathlib import Path

from benchmarks._hlo_stats import KINDS

START, END = "<!-- bench:start -->", "<!-- bench:end -->"
SHORT = {"data_parallel": "DP", "fsdp": "FSDP", "megatron_tp": "TP", "2d": "2D", "dcn_dp_ici_tp": "DCN-DP x TP",
         "dcn_dp_ici_fsdp": "DCN-DP x FSDP", "auto": "AUTO"}


def progress(row: dict) -> None:
    """One line per strategy while the benchmark runs."""
    bits = [f"{row['model']:<13} {row['where']:<22} {SHORT[row['strategy']]:<13}",
            f"modelled {row['modelled_ms']:9.3f} ms  MFU {row['mfu']:6.2%}"]
    if "exec_ms" in row:
        bits.append(f"measured {row['exec_ms']:7.1f} ms (lazy step {row['lazy_ms']:6.1f})  "
                    f"peak {row['peak_mib']:6.1f} MiB  coll {row['collective_mib']:6.2f} MiB"
                    + (f"  = {row['same_as']}" if row.get("same_as") else "")
                    + ("" if row.get("loss_ok", True) else f"  LOSS MISMATCH {row['loss0']:.5f} vs {row['loss_cpu']:.5f}"))
    if row.get("solve_s") is not None:
        bits.append(f"solve {row['solve_s']:.2f} s ({row['status']})")
    print("  ".join(bits), flush=True)


def _cases(rows: list[dict]) -> dict[tuple[str, str], list[dict]]:
    out: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        out.setdefault((r["model"], r["where"]), []).append(r)
    return out


def case_summary(group: list[dict]) -> dict:
    """AUTO against the best manual strategy of one case (modelled, and measured if present)."""
    auto = next(r for r in group if r["strategy"] == "auto")
    manual = [r for r in group if r["strategy"] != "auto" and r["fits"]]
    best_m = min(manual, key=lambda r: r["modelled_ms"])
    s = dict(model=auto["model"], where=auto["where"], auto_ms=auto["modelled_ms"], best_ms=best_m["modelled_ms"],
             best=SHORT[best_m["strategy"]], modelled_ok=auto["modelled_ms"] <= best_m["modelled_ms"] * (1 + 1e-9),
             mfu=auto["mfu"], best_mfu=best_m["mfu"], solve_s=auto["solve_s"], fits=auto["fits"],
             peak_mib=auto["modelled_peak_mib"], budget_mib=auto["budget_mib"])
    if "exec_ms" in auto:
        best_x = min(manual, key=lambda r: r["exec_ms"])
        s.update(auto_x=auto["exec_ms"], best_x=best_x["exec_ms"], best_x_name=SHORT[best_x["strategy"]],
                 measured_ok=auto["exec_ms"] <= 1.10 * best_x["exec_ms"], auto_peak=auto["peak_mib"],
                 auto_coll=auto["collective_mib"], best_coll=best_x["collective_mib"])
    return s


def summary_table(rows: list[dict]) -> str:
    """AUTO vs the best manual strategy per (model, mesh or topology)."""
    head = ["model", "mesh / system", "AUTO modelled ms", "best manual modelled ms", "ratio", "AUTO MFU",
            "AUTO measured ms", "best manual measured ms", "ratio", "AUTO peak MiB", "solve s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for group in _cases(rows).values():
        s = case_summary(group)
        cells = [s["model"], s["where"], f"{s['auto_ms']:.3f}", f"{s['best_ms']:.3f} ({s['best']})",
                 f"{s['best_ms'] / s['auto_ms']:.2f}x" + ("" if s["modelled_ok"] else " (miss)"),
                 f"{s['mfu']:.1%}"]
        if "auto_x" in s:
            cells += [f"{s['auto_x']:.1f}", f"{s['best_x']:.1f} ({s['best_x_name']})",
                      f"{s['best_x'] / s['auto_x']:.2f}x" + ("" if s["measured_ok"] else " (miss)"),
                      f"{s['auto_peak']:.1f}"]
        else:
            cells += ["-", "-", "-", f"{s['peak_mib']:.1f} (model)"]
        cells.append(f"{s['solve_s']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    ok_m = [case_summary(g)["modelled_ok"] for g in _cases(rows).values()]
    ok_x = [case_summary(g)["measured_ok"] for g in _cases(rows).values() if "exec_ms" in g[0]]
    fits = [case_summary(g)["fits"] for g in _cases(rows).values()]
    lines += ["", f"Ratios are best manual / AUTO (above 1: AUTO faster). Targets: AUTO's modelled step <= the best "
              f"manual one in {sum(ok_m)}/{len(ok_m)} cases; AUTO's measured step within 10% of the best manual "
              f"one in {sum(ok_x)}/{len(ok_x)} cases; AUTO within the memory budget in {sum(fits)}/{len(fits)}. "
              "Measured: median of the compiled step on 8 virtual CPU devices sharing 2 cores (noisy), each case's "
              "strategies timed round-robin (a new order each round) so load drift hits them alike; "
              "modelled: autoshard's cost model (virtual meshes: the `cpu` preset, which AUTO plans for)."]
    return "\n".join(lines)


def guard_table(rows: list[dict]) -> str:
    """The plan-quality guard per case where it spoke: what AUTO ties, what forced it, the largest layouts."""
    head = ["model", "mesh / system", "guard", "compared with", "ops that forced it", "cannot split", "largest tensors"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        if r["strategy"] == "auto" and r.get("guard"):
            cells = [r["model"], r["where"], r["guard"], r.get("reference", ""), r.get("forced_by", ""),
                     r.get("unsplittable", ""), r.get("largest", "")]
            lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) if len(lines) > 2 else "The guard found no case where AUTO ties a baseline."


def full_table(rows: list[dict]) -> str:
    """Every (model, case, strategy) row."""
    head = ["model", "mesh / system", "strategy", "modelled ms", "MFU", "modelled peak MiB", "measured ms",
            "lazy step ms", "peak MiB", *[f"{k} KiB (n)" for k in KINDS], "loss ok", "same layout as"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["model"], r["where"], SHORT[r["strategy"]], f"{r['modelled_ms']:.3f}", f"{r['mfu']:.2%}",
                 f"{r['modelled_peak_mib']:.1f}" + ("" if r["fits"] else " (over)")]
        if "exec_ms" in r:
            cells += [f"{r['exec_ms']:.1f}", f"{r['lazy_ms']:.1f}", f"{r['peak_mib']:.1f}",
                      *[f"{r[f'{k}_kib']:.0f} ({r[f'{k}_n']})" for k in KINDS], "yes" if r["loss_ok"] else "NO",
                      r.get("same_as") or ""]
        else:
            cells += ["-"] * (4 + len(KINDS)) + [""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def plots(rows: list[dict], out: Path, suffix: str = "") -> None:
    """Headline (AUTO speed-up over the best manual), measured and modelled bars, collective bytes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(_cases(rows).values())
    summ = [case_summary(g) for g in cases]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(14, 5))
    real = [s for s in summ if "auto_x" not in s]
    virt = [s for s in summ if "auto_x" in s]
    for ax, items, key, title in ((a1, real, ("best_ms", "auto_ms"), "modelled on real systems"),
                                  (a2, virt, ("best_x", "auto_x"), "measured on 8 virtual CPU devices")):
        vals = [s[key[0]] / s[key[1]] for s in items]
        ax.bar(range(len(items)), vals, color=["tab:green" if v >= 1 else "tab:red" for v in vals])
        ax.axhline(1.0, color="k", lw=0.8)
        if key[1] == "auto_x":
            ax.axhline(1 / 1.1, color="gray", ls="--", lw=0.8, label="10% slower than best manual")
            ax.legend(fontsize=7)
        ax.set_xticks(range(len(items)), [f"{s['model']}\n{s['where']}" for s in items], fontsize=6, rotation=60)
        ax.set_ylabel("best manual step time / AUTO step time")
        ax.set_title(f"AUTO vs best manual strategy, {title}")
    fig.tight_layout()
    fig.savefig(out / f"auto_vs_manual_headline{suffix}.png", dpi=110)
    plt.close(fig)
    _grouped(plt, rows, "exec_ms", "measured step ms (8 virtual CPU devices)", out / f"auto_vs_manual_measured{suffix}.png")
    _grouped(plt, [r for r in rows if r["topology"] != "cpu"], "modelled_ms", "modelled step ms",
             out / f"auto_vs_manual_modelled{suffix}.png", log=True)
    _grouped(plt, rows, "collective_mib", "collective MiB per device per step (partitioned HLO)",
             out / f"auto_vs_manual_collectives{suffix}.png")


def _grouped(plt, rows: list[dict], key: str, ylabel: str, path: Path, log: bool = False) -> None:
    rows = [r for r in rows if key in r]
    if not rows:
        return
    cases = list(_cases(rows))
    strats = [s for s in SHORT if any(r["strategy"] == s for r in rows)]
    width = 0.8 / len(strats)
    fig, ax = plt.subplots(figsize=(max(8, len(cases) * 0.9), 4.8))
    for j, st in enumerate(strats):
        xs, ys = [], []
        for i, c in enumerate(cases):
            r = next((r for r in rows if (r["model"], r["where"]) == c and r["strategy"] == st), None)
            if r is not None:
                xs.append(i + j * width - 0.4 + width / 2)
                ys.append(r[key])
        ax.bar(xs, ys, width, label=SHORT[st])
    ax.set_xticks(range(len(cases)), [f"{m}\n{w}" for m, w in cases], fontsize=6, rotation=60)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=7, ncol=len(strats))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def splice(text: str, block: str) -> str:
    """Replace what lies between the README markers with ``block``."""
    if START not in text or END not in text:
        raise ValueError(f"README has no {START} ... {END} markers")
    pattern = re.compile(re.escape(START) + r".*?" + re.escape(END), re.S)
    return pattern.sub(lambda _: f"{START}\n{block.strip()}\n{END}", text, count=1)


def op_coverage_line(path: Path) -> str:
    """The Core ATen row of ``benchmarks/results/op_coverage.md`` as one sentence ('' if absent)."""
    if not path.exists():
        return ""
    text = path.read_text()
    m = re.search(r"Core ATen[^|]*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+%)\s*\|\s*(\d+)\s*\|\s*([\d.]+%)", text)
    if m is None:
        return ""
    total, supported, _, match, pct = m.groups()
    return (f"Op coverage: {match} of {total} Core ATen overloads hit by torch's OpInfo samples match torch CPU "
            f"({pct}; {supported} lowered), from [benchmarks/results/op_coverage.md]"
            f"(benchmarks/results/op_coverage.md).")


def update_readme(summary: Path, readme: Path) -> None:
    """Splice the generated summary table (and the op-coverage figure) into the README."""
    if not summary.exists():
        raise FileNotFoundError(f"{summary} does not exist; run the full benchmark first")
    block = summary.read_text().strip()
    ops = op_coverage_line(summary.parent / "op_coverage.md")
    readme.write_text(splice(readme.read_text(), block + ("\n\n" + ops if ops else "")))
    print(f"updated {readme} from {summary}")
