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
It writes benchmarks/results/checkpoint_cost.json; ``python benchmarks/render.py`` puts
its table in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
from argparse import RawTextHelpFormatter
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sections
from eval_data import Run
from eval_report import pooled, q, round_args, stopwatch
from evaluate import rotated, run_checked
from results import write_result


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
    figures: dict[str, Any] = {
        "parallelism": p,
        "records": n,
        "launcher": "local",
        "none_processing_s": [round(run.processing, 4) for run, _ in runs["none"]],
        "settings": {},
    }
    for name in list(setups)[1:]:
        pairs = list(zip(runs[name], runs["none"], strict=True))

        def extra(i: int, pairs: list[Any] = pairs) -> list[float]:
            """Extra CPU of kind ``i`` per completed checkpoint, ms, per round."""
            return [
                round((c[i] - b[i]) / max(1, len(run.checkpoints)) * 1000, 3)
                for (run, c), (_, b) in pairs
            ]

        checkpointed = [run for run, _ in runs[name]]
        d, w = pooled(checkpointed, "duration_ms"), pooled(checkpointed, "write_ms")
        figures["settings"][name] = {
            "config": setups[name],
            "time_ratio": [round(run.processing / b.processing, 5) for (run, _), (b, _) in pairs],
            "cpu_ratio": [round(sum(c) / sum(b), 5) for (_, c), (_, b) in pairs],
            "checkpoints_per_run": [len(run.checkpoints) for run in checkpointed],
            "extra_cpu_ms": {
                "tasks_user": extra(0),
                "tasks_system": extra(1),
                "job_manager": extra(2),
            },
            "duration_ms": {"p50": q(d, 0.5), "p99": q(d, 0.99)},
            "write_ms": {"p50": q(w, 0.5), "p99": q(w, 0.99)},
        }
    path = write_result("checkpoint_cost", figures, rounds=args.repeat)
    print("\n" + sections.checkpoint_cost_table(figures))
    say(f"wrote {path}; `python benchmarks/render.py` puts it in docs/benchmarks.md")


if __name__ == "__main__":
    main()
