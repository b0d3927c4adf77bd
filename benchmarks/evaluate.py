"""The ABS paper's evaluation (Carbone et al. 2015, section 6) for the snapshot modes, in
one command:

    python benchmarks/evaluate.py              # 20 s runs, 6 interleaved rounds (~45 min)
    python benchmarks/evaluate.py --seconds 5 --launcher local   # shorter, no JVM
    python benchmarks/evaluate.py --full       # every mode, p up to 8: for bigger machines

On the paper's topology (benchmarks/paper_topology.py: six operators, three hash
shuffles, chaining off, 6p tasks) it first measures the job's capacity (records/s without
checkpoints), sizes every run to last ``--seconds``, and then runs ``--repeat`` rounds; a
round runs every configuration once, in an order rotated from round to round, so slow
drifts of the machine fall on every configuration alike. Each figure is the median over
rounds; a ratio is taken within a round (against that round's run without checkpoints)
before the median. Tables give the interquartile range (IQR); a claim rests on the
median's 95 % confidence interval when there are at least 6 rounds, else on the IQR,
by the rules of benchmarks/verdicts.py. It measures:

1. **fig. 6, full speed**: processing time against the checkpoint interval for aligned
   ABS (``exactly_once``) and for Naiad's synchronous snapshots, as ratios to no
   checkpoints, with the number of checkpoints each run completed, their duration p50 /
   p99, what they waited for (queueing, alignment, write at the task written last) and,
   for synchronous, the share of the run the sources were halted and how long each
   drain took; unaligned barriers at
   one interval beside them;
2. **the same, throttled**: the sources limited to ``--throttle`` of the capacity, so the
   job is not throughput-bound: end-to-end record latency p50 / p99 (source to sink);
3. **fig. 7, fixed-data (strong) scaling**: the same number of records at every
   parallelism, ABS every 3 s (the paper's interval) against no checkpoints;
4. **backpressure**: a hot key on one slowed keyed task, per mode;
5. **recovery**: one SIGKILL per mode, time until processing again, exact result.

Processing time is submit-to-all-output-committed minus start-up (submit to first
record). It writes its result file, benchmarks/results/evaluate.json (every run's
figures, the command, commit and machine); ``python benchmarks/render.py`` then writes
docs/evaluation.md from it (tables and the conclusions the figures support) and, with
matplotlib (``pip install -e '.[bench]'``), the plots with error bars beside it.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eval_data import MODES, Config, Evaluation, Run, Setting, Study
from paper_topology import TASKS_PER_P, build, check
from results import write_result

from jobmanager import launcher
from jobmanager.faults import Kill
from jobmanager.result import JobResult
from runtime.config import JobConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(REPO, "docs")

# The backpressure scenario's sources emit for this long (faster than the hot task can
# follow), so periodic checkpoints are taken under backpressure, not only after the
# sources ended and the backlog drains.
BACKPRESSURE_SOURCE_SECONDS = 6.0


def default_setting(seconds: float, repeat: int, full: bool, launcher: str) -> Setting:
    return Setting(
        seconds=seconds,
        repeat=repeat,
        parallelism=2,
        intervals=[0.1, 0.25, 0.5, 1.0, 2.0] if full else [0.1, 0.5, 1.0],
        other_modes=["unaligned"] + (["at_least_once", "aligned_timeout"] if full else []),
        throttle=0.5,
        throttled=[
            Config(None),
            Config("exactly_once", 0.1),
            Config("synchronous", 0.1),
            Config("exactly_once", 1.0),
        ],
        parallelisms=[1, 2, 4, 6, 8] if full else [1, 2, 3],
        backpressure_modes=list(MODES) if full else ["exactly_once", "unaligned", "synchronous"],
        launcher=launcher,
    )


def run_checked(n: int, parallelism: int, **kwargs: Any) -> JobResult:
    result = build(n, parallelism, progress=False, ui=False, **kwargs).run()
    if not check(result, n):
        raise SystemExit(f"wrong result: n={n} p={parallelism} {kwargs}")
    return result


def rotated(items: list[Any], k: int) -> list[Any]:
    k %= max(1, len(items))
    return items[k:] + items[:k]


def calibrate(s: Setting, say: Callable[[str], None]) -> float:
    """Records/s of the topology without checkpoints (median of three runs, the first
    sized by a short probe)."""
    probe = run_checked(300_000, s.parallelism, launcher=s.launcher)
    rate = 300_000 / max(0.1, Run.of(probe).processing)
    n = int(rate * min(s.seconds, 8.0))
    rates = sorted(
        n / Run.of(run_checked(n, s.parallelism, launcher=s.launcher)).processing for _ in range(3)
    )
    say(f"capacity: {rates[1]:,.0f} records/s (runs {rates[0]:,.0f}-{rates[2]:,.0f})")
    return rates[1]


def rounds(
    s: Setting, capacity: float, say: Callable[[str], None]
) -> tuple[Study, Study, dict[int, Study]]:
    """Every round runs each configuration of the three studies once (interleaved)."""
    full = Study(n=int(capacity * s.seconds))
    rate = s.throttle * capacity
    throttled = Study(n=int(rate * s.seconds), rate=rate)
    # p = s.parallelism is the full-speed study itself (its run without checkpoints is
    # shared; it gets one more configuration, ABS at the scaling interval)
    scaling = {p: full if p == s.parallelism else Study(n=full.n) for p in s.parallelisms}
    jobs: list[tuple[Study, str, Callable[[], JobResult]]] = []
    for c in s.full_speed():
        jobs.append((full, c.label, _job(s, full.n, s.parallelism, c.settings())))
    for c in s.throttled:
        settings = {**c.settings(), "rate": rate}
        jobs.append((throttled, c.label, _job(s, throttled.n, s.parallelism, settings)))
    for p in s.parallelisms:
        scaled = [Config("exactly_once", s.scaling_interval)]
        if p != s.parallelism:
            scaled.insert(0, Config(None))
        for c in scaled:
            jobs.append((scaling[p], c.label, _job(s, scaling[p].n, p, c.settings())))
    for r in range(s.repeat):
        started = time.monotonic()
        for study, label, job in rotated(jobs, r * 7):
            study.runs.setdefault(label, []).append(Run.of(job()))
        say(f"  round {r + 1}/{s.repeat} done ({time.monotonic() - started:.0f} s)")
    return full, throttled, scaling


def _job(s: Setting, n: int, parallelism: int, settings: dict[str, Any]) -> Callable[[], JobResult]:
    return lambda: run_checked(n, parallelism, launcher=s.launcher, **settings)


def backpressure(s: Setting, say: Callable[[str], None]) -> Study:
    study = Study(n=s.backpressure_n)
    for r in range(s.repeat):
        for mode in rotated(s.backpressure_modes, r):
            result = run_checked(
                s.backpressure_n,
                s.parallelism,
                slow_key=0,
                slow_seconds=s.hot_sleep,
                hot_share=4,
                checkpoint_interval=0.25,
                rate=s.backpressure_n / BACKPRESSURE_SOURCE_SECONDS,
                launcher=s.launcher,
                **MODES[mode],
            )
            study.runs.setdefault(mode, []).append(Run.of(result))
        say(f"  backpressure round {r + 1}/{s.repeat} done")
    return study


def recovery(
    s: Setting, capacity: float, say: Callable[[str], None]
) -> dict[str, tuple[float | None, bool]]:
    out: dict[str, tuple[float | None, bool]] = {}
    n = int(capacity * 3)
    for mode in s.backpressure_modes:
        settings = {"checkpoint_interval": 0.25, **MODES[mode]}
        flow = build(
            n, s.parallelism, rate=n / 6, progress=False, ui=False, launcher=s.launcher, **settings
        )
        result = flow.run(faults=[Kill("count[1]", after_checkpoint=2)])
        seconds = result.restarts[0].recovery_seconds if result.restarts else None
        out[mode] = (seconds, check(result, n))
    say("  recovery done")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of a run (default 20)")
    ap.add_argument("--repeat", type=int, default=6, help="interleaved rounds (default 6)")
    ap.add_argument("--full", action="store_true", help="every mode and interval, p up to 8")
    ap.add_argument(
        "--launcher",
        choices=("spark", "local"),
        default="spark",
        help="spark (a local SparkSession) or local task processes (no JVM)",
    )
    args = ap.parse_args()
    if args.repeat < 1 or args.seconds <= 0:
        ap.error("--repeat must be >= 1 and --seconds > 0")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    s = default_setting(args.seconds, args.repeat, args.full, args.launcher)
    started = time.monotonic()

    def say(text: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {text}", flush=True)

    if s.launcher == "spark":
        launcher.ensure_session(TASKS_PER_P * max(s.parallelisms), JobConfig())
    capacity = calibrate(s, say)
    per_round = len(s.full_speed()) + len(s.throttled) + 2 * len(s.parallelisms) - 1
    say(
        f"{s.repeat} rounds of {per_round} configurations, {s.seconds:.0f} s runs "
        f"(about {s.repeat * per_round * (s.seconds + 2) / 60:.0f} min), then backpressure "
        "and recovery"
    )
    full, throttled, scaling = rounds(s, capacity, say)
    bp = backpressure(s, say)
    rec = recovery(s, capacity, say)
    evaluation = Evaluation(
        setting=s,
        capacity=capacity,
        full=full,
        throttled=throttled,
        scaling=scaling,
        backpressure=bp,
        recovery=rec,
        elapsed=time.monotonic() - started,
    )
    path = write_result("evaluate", evaluation.to_json(), rounds=s.repeat)
    say(f"wrote {path}; `python benchmarks/render.py` writes docs/evaluation.md from it")


if __name__ == "__main__":
    main()
