"""The figures, tables, conclusions and plots of ``benchmarks/evaluate.py``.

Every figure is a median over rounds with its interquartile range; a ratio is taken
within a round before the median. The conclusions are derived from the figures by the
rules stated beside them (``verdicts``), so the text cannot claim what the run did not
show.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from paper_topology import TASKS_PER_P, percentile

if TYPE_CHECKING:
    from evaluate import Run, Setting, Study

# Targets of the issue this evaluation answers (issue 18), checked in the conclusions.
OVERHEAD_TARGET = 0.05  # ABS every 0.1 s
P99_TARGET_MS = 250.0  # aligned checkpoint duration at full load


def round_args(
    doc: str | None,
    seconds: float,
    intervals: bool = False,
    parser: argparse.ArgumentParser | None = None,
) -> argparse.Namespace:
    """The command line of a benchmark of interleaved rounds on the paper topology:
    ``--seconds`` a run, ``--repeat`` rounds, checkpoints every ``--interval`` s (with
    ``intervals``, a list of one or more). ``parser``: one holding the benchmark's own
    arguments."""
    ap = parser or argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawTextHelpFormatter
    )
    ap.add_argument("--seconds", type=float, default=seconds, help=f"length of a run ({seconds:g})")
    ap.add_argument("--repeat", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument(
        "--interval",
        type=float,
        nargs="+" if intervals else None,
        default=[0.1] if intervals else 0.1,
        help="checkpoint interval" + ("s (0.1 s)" if intervals else " (0.1 s)"),
    )
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--out", help="also write the table to this Markdown file")
    args = ap.parse_args()
    if (
        args.repeat < 1
        or args.seconds <= 0
        or min(args.interval if intervals else [args.interval]) <= 0
    ):
        ap.error("--repeat must be >= 1, --seconds and --interval > 0")
    return args


def stopwatch() -> Callable[[str], None]:
    """``say(text)``: print ``text`` after the seconds since this call."""
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {text}", flush=True)

    return say


def report(text: str, title: str, out: str | None, say: Callable[[str], None]) -> None:
    """Print ``text``; with ``out``, also write it to that Markdown file under ``title``."""
    print("\n" + text)
    if out:
        with open(out, "w") as fh:
            fh.write(f"# {title}\n\n" + text)
        say(f"wrote {out}")


@dataclass(frozen=True)
class Spread:
    """A median with its interquartile range."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        v = sorted(values)
        if not v:
            return cls(float("nan"), float("nan"), float("nan"))
        if len(v) == 1:
            return cls(v[0], v[0], v[0])
        q1, _, q3 = statistics.quantiles(v, n=4, method="inclusive")
        return cls(statistics.median(v), q1, q3)

    def fmt(self, digits: int = 2, scale: float = 1.0) -> str:
        return (
            f"{self.median * scale:.{digits}f} "
            f"[{self.q1 * scale:.{digits}f}-{self.q3 * scale:.{digits}f}]"
        )

    def contains(self, x: float) -> bool:
        return self.q1 <= x <= self.q3


def overhead_verdict(time_ratio: Spread, target: float) -> str:
    """How a time ratio (with checkpoints / without) stands against an overhead target:
    within it only if its whole IQR is."""
    name = f"the {100 * target:.0f} % target"
    if time_ratio.q3 - 1 <= target:
        return f"within {name}, over the whole IQR"
    if time_ratio.median - 1 <= target:
        return f"the median is within {name}, the IQR is not: not shown to stay under it"
    return f"above {name}"


def median_ci(values: Iterable[float], level: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval of the median: the order statistics
    ``(v[k], v[n-k+1])`` (1-based) with the largest ``k`` for which a Binomial(n, 1/2)
    leaves at most ``(1 - level) / 2`` below ``k``. NaNs when ``values`` are too few
    (fewer than 6 for 95 %)."""
    v = sorted(values)
    n, tail, cdf, k = len(v), (1.0 - level) / 2, 0.0, 0
    while k < n and cdf + math.comb(n, k) / 2**n <= tail:
        cdf += math.comb(n, k) / 2**n
        k += 1
    if k == 0:
        return float("nan"), float("nan")
    return v[k - 1], v[n - k]


def ratios(study: Study, label: str, base: str = "none") -> Spread:
    """Processing time of ``label`` over ``base`` in the same round, per round."""
    pairs = zip(study.runs[label], study.runs[base], strict=True)
    return Spread.of(r.processing / b.processing for r, b in pairs)


def paired_gap(study: Study, a: str, b: str) -> Spread:
    """Per round: ratio of ``a`` minus ratio of ``b`` (both against ``none``)."""
    none = study.runs["none"]
    pairs = zip(study.runs[a], study.runs[b], none, strict=True)
    return Spread.of((x.processing - y.processing) / z.processing for x, y, z in pairs)


def pooled(runs: list[Run], key: str) -> list[float]:
    return [float(c.get(key) or 0.0) for r in runs for c in r.checkpoints]


def q(values: list[float], f: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(f * len(ordered)))] if ordered else float("nan")


def durations(runs: list[Run]) -> str:
    d = pooled(runs, "duration_ms")
    return f"{q(d, 0.5):.0f} / {q(d, 0.99):.0f}" if d else "-"


def waited(runs: list[Run]) -> str:
    parts = [
        statistics.median(pooled(runs, k) or [0.0])
        for k in ("queueing_ms", "alignment_ms", "write_ms")
    ]
    return " / ".join(f"{p:.0f}" for p in parts) if any(r.checkpoints for r in runs) else "-"


def per_run(runs: list[Run]) -> Spread:
    return Spread.of(len(r.checkpoints) for r in runs)


def halted_share(runs: list[Run]) -> str:
    if not any(c.get("halt_ms") for r in runs for c in r.checkpoints):
        return "-"
    share = Spread.of(
        sum(float(c.get("halt_ms") or 0.0) for c in r.checkpoints) / 1000 / r.processing
        for r in runs
    )
    return share.fmt(0, 100) + " %"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


@dataclass
class Report:
    setting: Setting
    capacity: float
    full: Study
    throttled: Study
    scaling: dict[int, Study]
    backpressure: Study
    recovery: dict[str, tuple[float | None, bool]]
    elapsed: float
    command: str

    # -- tables --------------------------------------------------------------------------
    def fig6_rows(self) -> list[list[str]]:
        rows = []
        for c in self.setting.full_speed()[1:]:
            runs = self.full.runs[c.label]
            rows.append(
                [
                    str(c.mode),
                    f"{c.interval}",
                    ratios(self.full, c.label).fmt(),
                    per_run(runs).fmt(0),
                    durations(runs),
                    waited(runs),
                    halted_share(runs),
                ]
            )
        return rows

    def latency(self, label: str, f: float) -> Spread:
        return Spread.of(percentile(r.latency, f) for r in self.throttled.runs[label])

    def throttled_rows(self) -> list[list[str]]:
        budget = self.throttled.n / (self.throttled.rate or 1.0)
        rows = []
        for c in self.setting.throttled:
            runs = self.throttled.runs[c.label]
            rows.append(
                [
                    "none" if c.mode is None else f"{c.mode} every {c.interval} s",
                    self.latency(c.label, 0.5).fmt(0),
                    self.latency(c.label, 0.99).fmt(0),
                    per_run(runs).fmt(0) if c.mode else "-",
                    durations(runs) if c.mode else "-",
                    Spread.of(r.processing / budget for r in runs).fmt(),
                ]
            )
        return rows

    def scaling_rows(self) -> list[list[str]]:
        rows = []
        for p, study in sorted(self.scaling.items()):
            none = Spread.of(r.processing for r in study.runs["none"])
            abs_ = Spread.of(r.processing for r in study.runs["exactly_once@0.5"])
            rows.append(
                [
                    str(p),
                    str(TASKS_PER_P * p),
                    none.fmt(),
                    abs_.fmt(),
                    ratios(study, "exactly_once@0.5").fmt(),
                ]
            )
        return rows

    def backpressure_rows(self) -> list[list[str]]:
        rows = []
        for mode in self.setting.backpressure_modes:
            runs = self.backpressure.runs[mode]
            rows.append(
                [
                    mode,
                    Spread.of(r.processing for r in runs).fmt(),
                    f"{per_run(runs).median:.0f} / {statistics.median(r.failed for r in runs):.0f}",
                    f"{q(pooled(runs, 'max_alignment_ms'), 0.5):.0f}",
                    durations(runs),
                    waited(runs),
                    f"{q(pooled(runs, 'channel_state_bytes'), 0.5) / 1024:.0f}",
                ]
            )
        return rows

    # -- conclusions ---------------------------------------------------------------------
    def verdicts(self) -> list[str]:
        s, out = self.setting, []
        short = min(s.intervals)
        abs_short = ratios(self.full, f"exactly_once@{short}")
        out.append(
            f"**ABS every {short} s costs {100 * (abs_short.median - 1):+.1f} %** of processing "
            f"time (IQR {100 * (abs_short.q1 - 1):+.1f} to {100 * (abs_short.q3 - 1):+.1f} %): "
            f"{overhead_verdict(abs_short, OVERHEAD_TARGET)}."
        )
        for interval in s.intervals[1:]:
            r = ratios(self.full, f"exactly_once@{interval}")
            noise = "within noise (its IQR contains 1.00)" if r.contains(1.0) else "outside noise"
            out.append(f"ABS every {interval} s: {r.fmt()} — {noise}.")
        gaps = []
        for interval in s.intervals:
            gap = paired_gap(self.full, f"synchronous@{interval}", f"exactly_once@{interval}")
            clear = gap.q1 > 0
            gaps.append(clear)
            out.append(
                f"Synchronous minus ABS at {interval} s: {gap.fmt(3)} of the no-checkpoint time "
                + ("(clearly above: the whole IQR is > 0)." if clear else "(not clearly above).")
            )
        near = abs_short.median - 1 <= OVERHEAD_TARGET
        holds = near and gaps[0]
        out.append(
            "**Fig. 6's claim (ABS near no snapshots, far below synchronous at short intervals) "
            + ("holds here**" if holds else "does not fully hold here**")
            + f": ABS at {short} s is {'near' if near else 'not near'} no snapshots, and "
            f"synchronous is {'clearly' if gaps[0] else 'not clearly'} costlier at {short} s."
        )
        d = pooled(self.full.runs[f"exactly_once@{short}"], "duration_ms")
        p99 = q(d, 0.99)
        out.append(
            f"Aligned checkpoint duration at full load (ABS every {short} s, "
            f"{len(d)} checkpoints): p50 {q(d, 0.5):.0f} ms, p99 {p99:.0f} ms — "
            + ("within" if p99 <= P99_TARGET_MS else "above")
            + f" the {P99_TARGET_MS:.0f} ms p99 target."
        )
        lat = {c.label: self.latency(c.label, 0.99) for c in s.throttled}
        out.append(
            f"Throttled to {100 * s.throttle:.0f} % of capacity, latency p99: "
            + ", ".join(f"{label} {v.median:.0f} ms" for label, v in lat.items())
            + "."
        )
        return out

    def markdown(self) -> str:
        s = self.setting
        head = (
            f"Generated by `{self.command}` on {time.strftime('%Y-%m-%d')}, "
            f"{os.cpu_count()} cores, Python {platform.python_version()}; "
            f"{self.elapsed / 60:.0f} minutes. Topology: six operators, three hash shuffles, "
            f"chaining off (6p tasks), parallelism {s.parallelism}. Capacity without "
            f"checkpoints: {self.capacity:,.0f} records/s, so a full-speed run is "
            f"{self.full.n:,} records (~{s.seconds:.0f} s). {s.repeat} interleaved rounds; "
            "every figure is the median over rounds with its interquartile range [q1-q3]; "
            "ratios are taken within a round, against that round's run without checkpoints. "
            "Times are processing times (first record to all output committed)."
        )
        return "\n".join(
            [
                "# Evaluation: snapshot modes on the ABS paper's topology",
                "",
                head,
                "",
                "## What the figures say",
                "",
                *[f"- {v}" for v in self.verdicts()],
                "",
                "How the modes differ, to read the figures by: aligned ABS never stops the "
                "job; a task blocks only the inputs whose barrier came first, for as long as "
                "the other inputs' barriers take to arrive, and writes its state in the "
                "background. Synchronous snapshots (Naiad's) halt every source, wait until "
                "nothing is in flight anywhere, and only then snapshot: for each checkpoint "
                "the job stops for the time its queues take to drain (the *sources halted* "
                "column), so the shorter the interval, the larger the share of the run spent "
                "halted. Unaligned barriers overtake queued records and log them instead.",
                "",
                "## Processing time against the checkpoint interval, full speed (fig. 6)",
                "",
                f"No checkpoints: {Spread.of(r.processing for r in self.full.runs['none']).fmt()} s.",
                "",
                table(
                    [
                        "mode",
                        "interval s",
                        "time / no checkpoints",
                        "checkpoints per run",
                        "duration ms p50 / p99",
                        "waited for ms: queueing / alignment / write",
                        "sources halted",
                    ],
                    self.fig6_rows(),
                ),
                "",
                "*Waited for*: at the task whose state was written last, the time from the "
                "trigger to its first barrier (barriers behind queued records), from its first "
                "to its last barrier, and writing its state (medians over all checkpoints).",
                "",
                f"## Throttled to {100 * s.throttle:.0f} % of capacity: latency",
                "",
                f"{self.throttled.n:,} records at {self.throttled.rate or 0:,.0f} records/s. "
                "Latency is from the time the source's schedule says a record is due to the "
                "sink, so time a source spent held back (halted, backpressured) counts.",
                "",
                table(
                    [
                        "checkpoints",
                        "latency p50 ms",
                        "latency p99 ms",
                        "checkpoints per run",
                        "duration ms p50 / p99",
                        "time / time at the rate",
                    ],
                    self.throttled_rows(),
                ),
                "",
                "## Processing time against parallelism (fig. 7)",
                "",
                table(
                    ["p", "tasks", "no checkpoints s", "ABS every 0.5 s s", "ratio"],
                    self.scaling_rows(),
                ),
                "",
                f"This machine has {os.cpu_count()} cores: the 6p task processes share them, "
                "so more parallelism adds processes, not speed, and weak scaling (fig. 7's "
                "claim) cannot be shown here; `--full` runs p up to 8 for bigger machines. "
                "What this machine can show is the ratio column: the cost of ABS as the "
                "number of tasks grows.",
                "",
                "## Backpressure: a hot key on one slowed keyed task",
                "",
                f"{s.backpressure_n:,} records, a quarter on key 0, whose `regroup` task sleeps "
                f"{s.hot_sleep * 1e6:.0f} µs per record of it (the job's bottleneck); the "
                "sources emit for "
                f"{6:.0f} s, checkpoints every 0.25 s.",
                "",
                table(
                    [
                        "mode",
                        "processing s",
                        "checkpoints completed / failed per run",
                        "max alignment ms (p50)",
                        "duration ms p50 / p99",
                        "waited for ms: queueing / alignment / write",
                        "channel state KiB (p50)",
                    ],
                    self.backpressure_rows(),
                ),
                "",
                "## Recovery",
                "",
                table(
                    ["mode", "processing again after s", "exact result"],
                    [
                        [m, "-" if sec is None else f"{sec:.2f}", "yes" if ok else "no"]
                        for m, (sec, ok) in self.recovery.items()
                    ],
                ),
                "",
                "SIGKILL of `count[1]` after checkpoint 2, to the first record processed after "
                "the restore.",
                "",
            ]
        )


def plots(report: Report, docs: str) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    s, written = report.setting, []

    def bars(ax: Any, xs: list[float], spreads: list[Spread], label: str) -> None:
        med = [v.median for v in spreads]
        err = [[v.median - v.q1 for v in spreads], [v.q3 - v.median for v in spreads]]
        ax.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=label)

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode in ("exactly_once", "synchronous"):
        bars(ax, s.intervals, [ratios(report.full, f"{mode}@{i}") for i in s.intervals], mode)
    for mode in s.other_modes:
        bars(ax, [0.5], [ratios(report.full, f"{mode}@0.5")], mode)
    ax.axhline(1.0, color="grey", linestyle="--", label="no checkpoints")
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (s)")
    ax.set_ylabel("processing time / no checkpoints")
    ax.set_title("Fig. 6: cost against the interval (median, IQR)")
    written.append(_save(fig, ax, docs, "evaluation-interval.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [c.label for c in s.throttled]
    for f, name in ((0.5, "p50"), (0.99, "p99")):
        spreads = [report.latency(label, f) for label in labels]
        bars(ax, list(range(len(labels))), spreads, f"latency {name}")
    ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(f"Throttled to {100 * s.throttle:.0f} % of capacity")
    written.append(_save(fig, ax, docs, "evaluation-latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    ps = list(report.scaling)
    xs = [float(p) for p in ps]
    bars(ax, xs, [ratios(report.scaling[p], "exactly_once@0.5") for p in ps], "ABS every 0.5 s")
    ax.axhline(1.0, color="grey", linestyle="--", label="no checkpoints")
    ax.set_xlabel("parallelism p (6p tasks)")
    ax.set_ylabel("processing time / no checkpoints")
    ax.set_title("Fig. 7 on 2 cores: ABS cost as tasks grow")
    written.append(_save(fig, ax, docs, "evaluation-parallelism.png"))
    return written


def _save(fig: Any, ax: Any, docs: str, name: str) -> str:
    ax.legend(fontsize=8)
    path = os.path.join(docs, name)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
