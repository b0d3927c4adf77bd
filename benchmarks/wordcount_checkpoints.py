"""Checkpoint durations of the main example, pooled over several runs.

    python benchmarks/wordcount_checkpoints.py [--runs 6] [--words 4000000] [--config JSON]

Runs ``examples/wordcount.py``'s job (4,000,000 words, parallelism 2, a checkpoint every
0.5 s, on the embedded local Spark) ``--runs`` times one after another, checks each
result against collections.Counter, and prints every checkpoint's duration and what it
waited for (queueing, alignment, write at the task written last), then the pooled p50,
p99 and maximum. One run takes only 3-5 checkpoints: a p99 needs the pool. ``--config``
adds job settings (e.g. ``'{"batch_size": 4000}'``) to every run.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

import wordcount


def nearest_rank(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--words", type=int, default=4_000_000)
    ap.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "absflow-bench-wordcount")
    )
    ap.add_argument(
        "--config", type=json.loads, default={}, help="job settings as JSON for every run"
    )
    args = ap.parse_args()
    paths = wordcount.make_corpus(args.data, args.words)
    expected: collections.Counter[str] = collections.Counter()
    for path in paths:
        with open(path) as fh:
            expected.update(fh.read().split())
    pooled, runs = [], []
    for i in range(args.runs):
        result = wordcount.build(
            paths, 2, **{"checkpoint_interval": 0.5, "progress": False, "ui": False, **args.config}
        ).run()
        if wordcount.final_counts(result.output("counts")) != dict(expected):
            raise SystemExit(f"run {i}: the counts differ from collections.Counter")
        checkpoints = [c for c in result.checkpoints if not c.get("final")]
        pooled += checkpoints
        runs.append(result.duration)
        parts = ", ".join(
            f"{c['duration_ms']:.0f} (q {c['queueing_ms']:.0f} a {c['alignment_ms']:.0f} "
            f"w {c['write_ms']:.0f})"
            for c in checkpoints
        )
        print(f"run {i}: {result.duration:.2f} s, checkpoints ms: {parts}", flush=True)
    durations = [c["duration_ms"] for c in pooled]
    print(
        f"{len(durations)} checkpoints over {args.runs} runs (run {statistics.median(runs):.2f} s "
        f"median, {min(runs):.2f}-{max(runs):.2f}): duration p50 {statistics.median(durations):.0f} "
        f"ms, p99 {nearest_rank(durations, 0.99):.0f} ms, max {max(durations):.0f} ms; "
        f"write p50 {statistics.median(c['write_ms'] for c in pooled):.0f} ms, queueing p50 "
        f"{statistics.median(c['queueing_ms'] for c in pooled):.0f} ms"
    )


if __name__ == "__main__":
    main()
