"""What an aligned checkpoint costs on the paper topology: CPU per checkpoint and time.

    python benchmarks/checkpoint_cost.py                    # 10 s runs, 5 interleaved rounds
    python benchmarks/checkpoint_cost.py --seconds 5 --repeat 3     # a quicker look
    python benchmarks/checkpoint_cost.py --interval 0.1 1 --no-files --repeat 30   # overhead

On a machine whose cores the job keeps busy, a checkpoint's overhead is the CPU it takes
from the records. Each round runs every setting once, in an order rotated from round to
round: no checkpoints; ABS every ``--interval`` s (each one given) with the default
``state_inline_threshold`` (small task states travel inline in the ack and
``_metadata``); and ABS at the first interval with every task state in a file of its own
(``state_inline_threshold=0``, as before inline states). The tasks run on the local
launcher, so they are this process's children and ``getrusage(RUSAGE_CHILDREN)``
measures their CPU; the job manager runs in this process. Per checkpointed setting it
prints, against the no-checkpoint run of the same round: processing time (ratio),
extra CPU per completed checkpoint (task processes' user and system time, the job
manager's), all median [IQR] over the rounds; and pooled over the rounds, checkpoint
duration and state write time (p50 / p99). The time ratio also gets a 95 % confidence
interval of its median (distribution-free, from the order statistics; it needs at least
6 rounds): an overhead claim holds only where that whole interval does. So does the
ratio of the CPU the run took (task processes and job manager together) to the
no-checkpoint run's: on a machine whose speed drifts from run to run, the same work
takes more or less time, and the CPU ratio then resolves what the time ratio cannot
(the job keeps both cores busy, so CPU the checkpoints take is time the records lose).
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import resource
import sys
import time
from argparse import RawTextHelpFormatter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eval_report import Spread, median_ci, pooled, q, report, round_args, stopwatch, table
from evaluate import Run, rotated, run_checked


def settings(intervals: list[float], files: bool) -> dict[str, dict[str, Any]]:
    """Each setting's job config: none, inline states at every interval, and with
    ``files`` every state a file at the first interval."""
    out: dict[str, dict[str, Any]] = {"none": {"checkpoint_interval": None}}
    for interval in intervals:
        out[f"ABS every {interval:g} s, small states inline (default)"] = {
            "checkpoint_interval": interval
        }
    if files:
        out[f"ABS every {intervals[0]:g} s, every state a file"] = {
            "checkpoint_interval": intervals[0],
            "state_inline_threshold": 0,
        }
    return out


def cpu() -> tuple[float, float, float]:
    """(children user, children system, this process user + system) seconds."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    me = resource.getrusage(resource.RUSAGE_SELF)
    return children.ru_utime, children.ru_stime, me.ru_utime + me.ru_stime


def measured(n: int, p: int, settings: dict[str, Any]) -> tuple[Run, tuple[float, ...]]:
    before = cpu()
    run = Run.of(run_checked(n, p, launcher="local", **settings))
    return run, tuple(b - a for a, b in zip(before, cpu(), strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=RawTextHelpFormatter)
    ap.add_argument("--no-files", action="store_true", help="skip the every-state-a-file runs")
    args = round_args(__doc__, 10.0, intervals=True, parser=ap)
    setups = settings(args.interval, files=not args.no_files)
    say = stopwatch()

    p = args.parallelism
    probe, _ = measured(300_000, p, {})
    n = int(300_000 / max(0.1, probe.processing) * args.seconds)
    say(f"runs of {n:,} records (~{args.seconds:.0f} s without checkpoints)")
    runs: dict[str, list[tuple[Run, tuple[float, ...]]]] = {name: [] for name in setups}
    for r in range(args.repeat):
        for name in rotated(list(setups), r):
            runs[name].append(measured(n, p, setups[name]))
        say(f"round {r + 1}/{args.repeat} done")
    rows = []
    for name in list(setups)[1:]:
        pairs = list(zip(runs[name], runs["none"], strict=True))

        def extra(i: int, pairs: list[Any] = pairs) -> str:
            """Extra CPU of kind ``i`` per completed checkpoint, ms (median [IQR])."""
            return Spread.of(
                (c[i] - b[i]) / max(1, len(run.checkpoints)) * 1000 for (run, c), (_, b) in pairs
            ).fmt(1)

        time_ratios = [run.processing / b.processing for (run, _), (b, _) in pairs]
        low, high = median_ci(time_ratios)
        cpu_ratios = [sum(c) / sum(b) for (_, c), (_, b) in pairs]
        cpu_low, cpu_high = median_ci(cpu_ratios)
        checkpointed = [run for run, _ in runs[name]]
        d, w = pooled(checkpointed, "duration_ms"), pooled(checkpointed, "write_ms")
        rows.append(
            [
                name,
                Spread.of(time_ratios).fmt(3),
                "-" if math.isnan(low) else f"{low:.3f}-{high:.3f}",  # under 6 rounds
                Spread.of(cpu_ratios).fmt(3),
                "-" if math.isnan(cpu_low) else f"{cpu_low:.3f}-{cpu_high:.3f}",
                Spread.of(len(run.checkpoints) for run in checkpointed).fmt(0),
                extra(0),
                extra(1),
                extra(2),
                f"{q(d, 0.5):.0f} / {q(d, 0.99):.0f}",
                f"{q(w, 0.5):.1f} / {q(w, 0.99):.1f}",
            ]
        )
    header = [
        "setting",
        "time vs none",
        "its median's 95 % CI",
        "CPU vs none",
        "its median's 95 % CI",
        "checkpoints per run",
        "CPU per checkpoint, ms: tasks user",
        "tasks system",
        "job manager",
        "duration p50 / p99 ms",
        "write p50 / p99 ms",
    ]
    plain = Spread.of(run.processing for run, _ in runs["none"]).fmt(2)
    text = (
        f"Generated on {time.strftime('%Y-%m-%d')}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}. `python "
        f"{' '.join(['benchmarks/checkpoint_cost.py', *sys.argv[1:]])}`: paper topology, "
        f"p={p}, local launcher, {n:,} records per run (no checkpoints: {plain} s), "
        f"{args.repeat} interleaved rounds, medians [IQR].\n\n" + table(header, rows) + "\n"
    )
    report(text, "What an aligned checkpoint costs", args.out, say)


if __name__ == "__main__":
    main()
