"""The figures, tables, conclusions and plots of ``benchmarks/evaluate.py``, rendered
from its result file by ``benchmarks/render.py``.

In the tables every figure is a median over rounds with its interquartile range; a ratio
is taken within a round before the median. The conclusions (``Report.verdicts``) quote
the interval they rest on and follow the rules of ``benchmarks/verdicts.py`` (within /
above / unresolved against a target, faster / slower / unresolved for a difference, a
median's confidence interval only from 6 rounds), so the text cannot claim what the run
did not show.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from eval_data import Evaluation, Run, Setting, Study
from paper_topology import TASKS_PER_P
from verdicts import (
    Difference,
    Interval,
    TargetVerdict,
    against_target,
    median_ci,
    time_difference,
)

__all__ = ["median_ci"]  # re-exported: benchmarks/checkpoint_cost.py and others use it

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


def ratio_values(study: Study, label: str, base: str = "none") -> list[float]:
    """Processing time of ``label`` over ``base`` in the same round, per round."""
    pairs = zip(study.runs[label], study.runs[base], strict=True)
    return [r.processing / b.processing for r, b in pairs]


def ratios(study: Study, label: str, base: str = "none") -> Spread:
    """The median and IQR of ``ratio_values``."""
    return Spread.of(ratio_values(study, label, base))


def gap_values(study: Study, a: str, b: str) -> list[float]:
    """Per round: ratio of ``a`` minus ratio of ``b`` (both against ``none``)."""
    none = study.runs["none"]
    pairs = zip(study.runs[a], study.runs[b], none, strict=True)
    return [(x.processing - y.processing) / z.processing for x, y, z in pairs]


def paired_gap(study: Study, a: str, b: str) -> Spread:
    return Spread.of(gap_values(study, a, b))


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
    """The share of each run the sources were halted (synchronous mode), median [IQR]."""
    if not any(c.get("halt_ms") for r in runs for c in r.checkpoints):
        return "-"
    share = Spread.of(
        sum(float(c.get("halt_ms") or 0.0) for c in r.checkpoints) / 1000 / r.processing
        for r in runs
    )
    return share.fmt(0, 100) + " %"


def drains(runs: list[Run]) -> str:
    """How long a synchronous checkpoint's drain took (halt until nothing was in
    flight), p50 / p99 over every checkpoint of the runs."""
    d = [float(c["drain_ms"]) for r in runs for c in r.checkpoints if c.get("drain_ms")]
    return f"{q(d, 0.5):.0f} / {q(d, 0.99):.0f}" if d else "-"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def percent(interval: Interval) -> str:
    """A time ratio's interval as a signed overhead in %, with its label."""
    return interval.shifted(-1.0, 100.0).fmt(1, " %", signed=True)


FIG6_SAYS = {
    TargetVerdict.WITHIN: "holds here",
    TargetVerdict.ABOVE: "does not hold here",
    TargetVerdict.UNRESOLVED: "is unresolved here",
}


@dataclass(frozen=True)
class Report:
    """The evaluation's page, from its result file: ``evaluation`` the figures,
    ``stamp`` the line naming the command, date, commit and machine."""

    evaluation: Evaluation
    stamp: str
    cores: int

    @property
    def setting(self) -> Setting:
        return self.evaluation.setting

    @property
    def full(self) -> Study:
        return self.evaluation.full

    @property
    def throttled(self) -> Study:
        return self.evaluation.throttled

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
                    drains(runs),
                ]
            )
        return rows

    def latency(self, label: str, f: float) -> Spread:
        return Spread.of(self.latency_values(label, f))

    def latency_values(self, label: str, f: float) -> list[float]:
        return [r.latency_ms.get(f, float("nan")) for r in self.throttled.runs[label]]

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
        label = self.setting.scaling_label
        for p, study in sorted(self.evaluation.scaling.items()):
            none = Spread.of(r.processing for r in study.runs["none"])
            abs_ = Spread.of(r.processing for r in study.runs[label])
            rows.append(
                [
                    str(p),
                    str(TASKS_PER_P * p),
                    none.fmt(),
                    abs_.fmt(),
                    per_run(study.runs[label]).fmt(0),
                    ratios(study, label).fmt(),
                ]
            )
        return rows

    def backpressure_rows(self) -> list[list[str]]:
        rows = []
        for mode in self.setting.backpressure_modes:
            runs = self.evaluation.backpressure.runs[mode]
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
        """Each conclusion with the interval it rests on and the rule's outcome
        (benchmarks/verdicts.py): a claim the interval does not settle is unresolved."""
        s, full, out = self.setting, self.full, []
        short = min(s.intervals)
        overhead = Interval.of(ratio_values(full, f"exactly_once@{short}")).shifted(-1.0)
        target = against_target(overhead, OVERHEAD_TARGET)
        out.append(
            f"**ABS every {short} s costs "
            f"{percent(Interval.of(ratio_values(full, f'exactly_once@{short}')))}** of "
            f"processing time against the {100 * OVERHEAD_TARGET:.0f} % target: "
            f"**{target.value}** (rule: within only if the whole interval is at or under "
            "the target, above only if it is all over it)."
        )
        for interval in s.intervals[1:]:
            r = Interval.of(ratio_values(full, f"exactly_once@{interval}"))
            diff = time_difference(r)
            out.append(
                f"ABS every {interval} s against no checkpoints: {percent(r)}: "
                f"**{DIFF_WORDS[diff]}**."
            )
        gap_diff = []
        for interval in s.intervals:
            gap = Interval.of(
                gap_values(full, f"synchronous@{interval}", f"exactly_once@{interval}")
            )
            diff = time_difference(gap, 0.0)
            gap_diff.append(diff)
            out.append(
                f"Synchronous minus ABS at {interval} s, in no-checkpoint times: "
                f"{gap.fmt(3, signed=True)}: synchronous is **{SYNC_WORDS[diff]}**."
            )
        if target is TargetVerdict.WITHIN and gap_diff[0] is Difference.SLOWER:
            claim = TargetVerdict.WITHIN
        elif target is TargetVerdict.ABOVE or gap_diff[0] is Difference.FASTER:
            claim = TargetVerdict.ABOVE
        else:
            claim = TargetVerdict.UNRESOLVED
        out.append(
            "**Fig. 6's claim (ABS near no snapshots, far below synchronous at short "
            f"intervals) {FIG6_SAYS[claim]}**: ABS at {short} s is {target.value} against "
            f"the target, and synchronous is {SYNC_WORDS[gap_diff[0]]} at {short} s "
            "(it holds only if both are resolved its way)."
        )
        p99s = [
            q([float(c.get("duration_ms") or 0.0) for c in r.checkpoints], 0.99)
            for r in full.runs[f"exactly_once@{short}"]
            if r.checkpoints
        ]
        p99 = Interval.of(p99s)
        out.append(
            f"Aligned checkpoint duration p99 at full load (ABS every {short} s, the p99 of "
            f"each run): {p99.fmt(0, ' ms')}: **{against_target(p99, P99_TARGET_MS).value}** "
            f"against the {P99_TARGET_MS:.0f} ms target."
        )
        lat = {c.label: Interval.of(self.latency_values(c.label, 0.99)) for c in s.throttled}
        out.append(
            f"Throttled to {100 * s.throttle:.0f} % of capacity, latency p99: "
            + "; ".join(f"{label} {v.fmt(0, ' ms')}" for label, v in lat.items())
            + "."
        )
        return out

    def markdown(self) -> str:
        s, ev = self.setting, self.evaluation
        head = (
            f"{self.stamp}. Topology: six operators, three hash shuffles, chaining off "
            f"(6p tasks), parallelism {s.parallelism}, {s.launcher} launcher. Capacity "
            f"without checkpoints: {ev.capacity:,.0f} records/s, so a full-speed run is "
            f"{self.full.n:,} records (~{s.seconds:g} s). {s.repeat} interleaved round(s); in "
            "the tables every figure is the median over rounds with its interquartile "
            "range [q1-q3]; ratios are taken within a round, against that round's run "
            "without checkpoints. Times are processing times (first record to all output "
            "committed); the whole run took "
            f"{ev.elapsed / 60:.0f} minutes."
        )
        return "\n".join(
            [
                "# Evaluation: snapshot modes on the ABS paper's topology",
                "",
                GENERATED_NOTE,
                "",
                head,
                "",
                "## What the figures say",
                "",
                RULES_NOTE,
                "",
                *[f"- {v}" for v in self.verdicts()],
                "",
                "How the modes differ, to read the figures by: aligned ABS never stops the "
                "job; a task blocks only the inputs whose barrier came first, for as long as "
                "the other inputs' barriers take to arrive, and writes its state in the "
                "background. Synchronous snapshots (Naiad's) halt every source, wait until "
                "nothing is in flight anywhere, and only then snapshot: for each checkpoint "
                "the job stops for the time its queues take to drain (the *sources halted* "
                "and *drain* columns), so the shorter the interval, the larger the share of "
                "the run spent halted. Unaligned barriers overtake queued records and log "
                "them instead.",
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
                        "sources halted, % of run",
                        "drain ms p50 / p99",
                    ],
                    self.fig6_rows(),
                ),
                "",
                "*Waited for*: at the task whose state was written last, the time from the "
                "trigger to its first barrier (barriers behind queued records), from its first "
                "to its last barrier, and writing its state (medians over all checkpoints). "
                "*Drain*: from the halt until nothing was in flight (synchronous only).",
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
                "## Fixed-data (strong) scaling: processing time against parallelism (fig. 7)",
                "",
                f"The same {self.full.n:,} records at every parallelism, ABS every "
                f"{s.scaling_interval:g} s (the paper's interval for fig. 7) against no "
                "checkpoints.",
                "",
                table(
                    [
                        "p",
                        "tasks",
                        "no checkpoints s",
                        f"ABS every {s.scaling_interval:g} s, s",
                        "checkpoints per run",
                        "ratio",
                    ],
                    self.scaling_rows(),
                ),
                "",
                f"This machine has {self.cores} cores: the 6p task processes share them, so "
                "more parallelism adds processes, not speed, and the paper's scaling cannot "
                "be shown here; `--full` runs p up to 8 for bigger machines. What this machine "
                "can show is the ratio column: the cost of ABS as the number of tasks grows.",
                "",
                "## Backpressure: a hot key on one slowed keyed task",
                "",
                f"{s.backpressure_n:,} records, a quarter on key 0, whose `regroup` task sleeps "
                f"{s.hot_sleep * 1e6:.0f} µs per record of it (the job's bottleneck); the "
                "sources emit for 6 s, checkpoints every 0.25 s.",
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
                        for m, (sec, ok) in ev.recovery.items()
                    ],
                ),
                "",
                "SIGKILL of `count[1]` after checkpoint 2, to the first record processed after "
                "the restore; one run per mode (a single figure, no spread).",
                "",
            ]
        )


GENERATED_NOTE = (
    "<!-- Generated by `python benchmarks/render.py` from benchmarks/results/evaluate.json: "
    "do not edit; run `python benchmarks/evaluate.py` and then the renderer. -->"
)
RULES_NOTE = (
    "Every claim quotes the interval it rests on: the 95 % confidence interval of the "
    "median over rounds (distribution-free) with at least 6 rounds, else the "
    "interquartile range, labelled as such. Against a target a figure is *within* only if "
    "the whole interval is at or under it, *above* only if the whole interval is over it, "
    "and *unresolved* where the interval straddles it; a difference is *faster* or *slower* "
    "only if the whole interval is on one side of no difference, else *unresolved* "
    "(`benchmarks/verdicts.py`)."
)
DIFF_WORDS = {
    Difference.FASTER: "faster than without checkpoints",
    Difference.SLOWER: "slower than without checkpoints",
    Difference.UNRESOLVED: "unresolved (the interval contains no difference)",
}
SYNC_WORDS = {
    Difference.SLOWER: "costlier than ABS",
    Difference.FASTER: "cheaper than ABS",
    Difference.UNRESOLVED: "not resolved against ABS",
}


def plots(report: Report, docs: str) -> list[str]:
    """The figures' plots as PNGs under ``docs`` (none without matplotlib)."""
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
    written.append(_save(plt, fig, ax, docs, "evaluation-interval.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    labels = [c.label for c in s.throttled]
    for f, name in ((0.5, "p50"), (0.99, "p99")):
        spreads = [report.latency(label, f) for label in labels]
        bars(ax, list(range(len(labels))), spreads, f"latency {name}")
    ax.set_xticks(range(len(labels)), labels, rotation=20, fontsize=7)
    ax.set_ylabel("end-to-end latency (ms)")
    ax.set_title(f"Throttled to {100 * s.throttle:.0f} % of capacity (median, IQR)")
    written.append(_save(plt, fig, ax, docs, "evaluation-latency.png"))

    fig, ax = plt.subplots(figsize=(6, 4))
    scaling = report.evaluation.scaling
    xs = [float(p) for p in scaling]
    for label, name in (("none", "no checkpoints"), (s.scaling_label, "ABS every 3 s")):
        spreads = [Spread.of(r.processing for r in scaling[p].runs[label]) for p in scaling]
        bars(ax, xs, spreads, name.replace("3", f"{s.scaling_interval:g}"))
    ax.set_xticks(xs, [str(p) for p in scaling])
    ax.set_ylim(bottom=0)
    ax.set_xlabel("parallelism p (6p tasks), the same records at every p")
    ax.set_ylabel("processing time (s)")
    ax.set_title(f"Fig. 7, fixed data (strong scaling) on {report.cores} cores (median, IQR)")
    written.append(_save(plt, fig, ax, docs, "evaluation-parallelism.png"))
    return written


def _save(plt: Any, fig: Any, ax: Any, docs: str, name: str) -> str:
    ax.legend(fontsize=8)
    path = os.path.join(docs, name)
    fig.tight_layout()
    # No timestamp in the PNG's metadata: the same result renders the same bytes.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path
