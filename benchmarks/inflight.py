"""How much data a channel may hold in flight: aligned checkpoint duration against
throughput, on the paper topology at full speed, in one command:

    python benchmarks/inflight.py                  # 10 s runs, 5 interleaved rounds (~12 min)
    python benchmarks/inflight.py --seconds 5 --repeat 3      # a quicker look
    python benchmarks/inflight.py --only default GC           # some settings (and the baseline)

An aligned barrier waits at every hop behind the records queued ahead of it, so the
channel settings (``max_inflight_time``: the batch sizer's target; ``channel_hwm``:
batches queued on each side; ``socket_buffer``: the kernel's share) set both how long a
checkpoint takes at full load and how much each frame costs. Every round runs each
setting twice, without checkpoints (throughput) and with aligned checkpoints every
``--interval`` seconds (their durations), in an order rotated from round to round. It
prints, per setting: processing time without checkpoints (median [IQR]), throughput
relative to the issue-18 baseline (fixed batches, 8 batches per side, OS buffers) within
each round, checkpoints per run, and pooled checkpoint duration p50 / p90 / p99 with
what they waited for (queueing / alignment / write, medians), and writes them to
benchmarks/results/inflight.json (``python benchmarks/render.py`` shows them in
docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eval_report import Spread, pooled, q, round_args, stopwatch, table, waited
from evaluate import Run, rotated, run_checked
from paper_topology import TASKS_PER_P
from results import write_result

from jobmanager import launcher
from runtime.config import JobConfig


def _small(inflight: float, hwm: int, **more: Any) -> dict[str, Any]:
    """The settings of the defaults before 2026-11-26's: 8 KiB socket buffers."""
    return {"max_inflight_time": inflight, "channel_hwm": hwm, "socket_buffer": 8192, **more}


SETTINGS: dict[str, dict[str, Any]] = {
    "before (fixed 1000-record batches, hwm 8, OS buffers, TCP)": {
        "max_inflight_time": None,
        "channel_hwm": 8,
        "socket_buffer": 0,
        "local_channels": False,
    },
    "default (0.015 s, hwm 8, 64 KiB, Unix sockets)": {},
    "the default over TCP": {"local_channels": False},
    "0.04 s, hwm 3, 8 KiB (the previous default)": _small(0.04, 3),
    "0.05 s, hwm 4, 8 KiB (the one before)": _small(0.05, 4),
    "0.03 s, hwm 3, 8 KiB": _small(0.03, 3),
    "0.04 s, hwm 6, 8 KiB": _small(0.04, 6),
    "0.04 s, hwm 6, 8 KiB, 2000-record batches": _small(0.04, 6, batch_size=2000),
    "the default with Python's GC settings (gc_threshold=None)": {"gc_threshold": None},
    "0.04 s, hwm 3, 8 KiB, 2000-record batches": _small(0.04, 3, batch_size=2000),
    "0.02 s, hwm 3, 8 KiB, batches up to 4000 records": _small(0.02, 3, batch_size=4000),
    "0.015 s, hwm 8, 64 KiB, batches up to 4000 records": {"batch_size": 4000},
}
BASELINE = next(iter(SETTINGS))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--only",
        nargs="+",
        metavar="WORD",
        help="run only the settings whose name contains one of these words (and the baseline)",
    )
    args = round_args(__doc__, 10.0, parser=ap)
    settings = {
        name: cfg
        for name, cfg in SETTINGS.items()
        if name == BASELINE or not args.only or any(w in name for w in args.only)
    }
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    say = stopwatch()

    p = args.parallelism
    launcher.ensure_session(TASKS_PER_P * p, JobConfig())
    # the faster of two probes: the session's first job also pays Spark's warm-up
    probe = min((Run.of(run_checked(300_000, p)) for _ in range(2)), key=lambda r: r.processing)
    n = int(300_000 / max(0.1, probe.processing) * args.seconds)
    say(f"runs of {n:,} records (~{args.seconds:.0f} s at the default setting)")
    plain: dict[str, list[Run]] = {name: [] for name in settings}
    checkpointed: dict[str, list[Run]] = {name: [] for name in settings}
    jobs = [(name, interval) for name in settings for interval in (None, args.interval)]
    for r in range(args.repeat):
        for name, interval in rotated(jobs, r * 3):
            result = run_checked(n, p, checkpoint_interval=interval, **settings[name])
            (plain if interval is None else checkpointed)[name].append(Run.of(result))
        say(f"round {r + 1}/{args.repeat} done")
    rows = []
    for name in settings:
        base = plain[BASELINE]
        speed = Spread.of(
            b.processing / x.processing for x, b in zip(plain[name], base, strict=True)
        )
        d = pooled(checkpointed[name], "duration_ms")
        rows.append(
            [
                name,
                Spread.of(x.processing for x in plain[name]).fmt(2),
                speed.fmt(2),
                Spread.of(len(x.checkpoints) for x in checkpointed[name]).fmt(0),
                f"{q(d, 0.5):.0f} / {q(d, 0.9):.0f} / {q(d, 0.99):.0f}" if d else "-",
                waited(checkpointed[name]),
            ]
        )
    header = [
        "setting",
        "processing s, no checkpoints",
        f"throughput vs {BASELINE.split(' (')[0]}",
        f"checkpoints per run (every {args.interval:g} s)",
        "duration p50 / p90 / p99 ms",
        "waited: queueing / alignment / write ms",
    ]
    figures = {
        "parallelism": p,
        "records": n,
        "interval": args.interval,
        "header": header,
        "rows": rows,
    }
    print("\n" + table(header, rows))
    path = write_result("inflight", figures, rounds=args.repeat)
    say(f"wrote {path}; `python benchmarks/render.py` puts it in docs/benchmarks.md")


if __name__ == "__main__":
    main()
