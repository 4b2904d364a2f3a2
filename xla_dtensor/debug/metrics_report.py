"""Timings and the metrics reports: counters plus per-phase time percentiles.

Phases recorded: ``trace`` (running a function lazily under ``compile``),
``compile`` (XLA compilation, lazy or compiled), ``execute`` (host time of a lazy
barrier on a cache hit), ``replay_host`` (host time of a ``compile`` replay),
``eager_op`` (host time of one eager op).

Example:
    >>> import xla_dtensor
    >>> print(xla_dtensor.short_metrics_report().splitlines()[0])
    xla_dtensor metrics (short)
"""
from __future__ import annotations

import collections

from xla_dtensor import metrics

__all__ = ["record", "timings", "reset_timings", "metrics_report", "short_metrics_report"]

_MAX = 10_000  # samples kept per phase (a ring)
_TIMES: dict[str, collections.deque[float]] = {}
_TOTAL: collections.Counter[str] = collections.Counter()
_COUNT: collections.Counter[str] = collections.Counter()


def record(phase: str, seconds: float) -> None:
    """Add one duration sample of ``phase`` (internal)."""
    d = _TIMES.get(phase)
    if d is None:
        d = _TIMES[phase] = collections.deque(maxlen=_MAX)
    d.append(seconds)
    _TOTAL[phase] += seconds
    _COUNT[phase] += 1


def timings() -> dict[str, dict[str, float]]:
    """Per phase: count, total seconds and p50/p90/p99 of the kept samples, in seconds."""
    out = {}
    for phase, d in _TIMES.items():
        s = sorted(d)
        if not s:
            continue
        pick = lambda q: s[min(len(s) - 1, int(q * len(s)))]  # noqa: E731
        out[phase] = {"count": _COUNT[phase], "total": _TOTAL[phase], "p50": pick(0.5), "p90": pick(0.9),
                      "p99": pick(0.99)}
    return out


def reset_timings() -> None:
    """Drop every timing sample."""
    _TIMES.clear()
    _TOTAL.clear()
    _COUNT.clear()


def _fmt(sec: float) -> str:
    return f"{sec * 1e3:.3f} ms" if sec < 1 else f"{sec:.2f} s"


def metrics_report() -> str:
    """Every counter and every phase's timing percentiles, as text.

    Example:
        >>> "compiles" in metrics_report()
        True
    """
    lines = ["xla_dtensor metrics", "counters:"]
    lines += [f"  {k:<22}{v}" for k, v in sorted(metrics.counters().items())]
    lines.append("timings:")
    for phase, t in sorted(timings().items()):
        lines.append(f"  {phase:<12} n={t['count']:<7} total={_fmt(t['total']):<11} p50={_fmt(t['p50']):<11} "
                     f"p90={_fmt(t['p90']):<11} p99={_fmt(t['p99'])}")
    return "\n".join(lines)


_SHORT = ("compiles", "xla_compiles", "persistent_cache_hits", "cache_hits", "executions", "compile_traces",
          "compile_replays", "transfers_to_host", "cpu_fallbacks")


def short_metrics_report() -> str:
    """The counters that explain most performance problems, and compile/trace time totals."""
    c = metrics.counters()
    lines = ["xla_dtensor metrics (short)"]
    lines += [f"  {k:<22}{c.get(k, 0)}" for k in _SHORT]
    t = timings()
    for phase in ("compile", "trace", "replay_host"):
        if phase in t:
            lines.append(f"  {phase + ' time':<22}{_fmt(t[phase]['total'])} (p50 {_fmt(t[phase]['p50'])})")
    return "\n".join(lines)
