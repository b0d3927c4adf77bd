"""How long a small pipeline's test takes on the test harness (``runtime.api.testing``: local
task processes, no Spark) and on local Spark.

    python benchmarks/harness.py              # 5 runs each of a 2-step keyed count
    python benchmarks/harness.py --runs 3 --records 20000

Spark's figures are per run on a session already started (as in a test suite, which starts
one per pytest process); the session's start is printed apart. Each run is a whole job:
submit, the tasks start and register, the records flow, a final checkpoint, the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Dataflow
from runtime.config import JobConfig
from runtime.sources import GeneratorSource


def small_pipeline(records: int) -> Dataflow:
    flow = Dataflow("small", parallelism=2, checkpoint_interval=0.1)
    (
        flow.source(GeneratorSource(lambda i: i % 100, records), name="numbers")
        .key_by(lambda x: x)
        .reduce(lambda a, b: a + b, name="sum")
        .collect("sums")
    )
    return flow


def timed(run: Callable[[], object], runs: int) -> list[float]:
    seconds = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - started)
    return seconds


def show(label: str, seconds: list[float]) -> None:
    print(
        f"{label:<24} median {statistics.median(seconds):6.2f} s   "
        f"min {min(seconds):6.2f} s   max {max(seconds):6.2f} s   ({len(seconds)} runs)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--records", type=int, default=10_000)
    args = ap.parse_args(argv)
    expected = len(small_pipeline(args.records).plan().tasks)
    print(f"a keyed sum of {args.records:,} records, {expected} tasks, checkpoints every 0.1 s")

    def local() -> None:
        small_pipeline(args.records).run(launcher="local")

    show("harness (local tasks)", timed(local, args.runs))

    from jobmanager import launcher

    started = time.perf_counter()
    launcher.ensure_session(expected, JobConfig())
    print(f"{'local Spark session':<24} started in {time.perf_counter() - started:6.2f} s")

    def spark() -> None:
        small_pipeline(args.records).run(launcher="spark")

    show("local Spark (per job)", timed(spark, args.runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
