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
from typing import Any

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
    corpus = Corpus(args.data, args.words)
    pooled, runs = [], []
    for i in range(args.runs):
        duration, checkpoints = corpus.run(args.config, f"run {i}")
        pooled += checkpoints
        runs.append(duration)
        print(f"run {i}: {duration:.2f} s, checkpoints ms: {describe(checkpoints)}", flush=True)
    print(
        f"{len(pooled)} checkpoints over {args.runs} runs (run {statistics.median(runs):.2f} s "
        f"median, {min(runs):.2f}-{max(runs):.2f}): {summary(pooled)}"
    )


class Corpus:
    """The main example's corpus and its expected counts (collections.Counter)."""

    def __init__(self, directory: str, words: int) -> None:
        self.paths = wordcount.make_corpus(directory, words)
        self.expected: collections.Counter[str] = collections.Counter()
        for path in self.paths:
            with open(path) as fh:
                self.expected.update(fh.read().split())

    def run(self, config: dict[str, Any], name: str) -> tuple[float, list[dict[str, Any]]]:
        """One run of the example's job (``config`` added), checked: its duration and
        its checkpoints but the final one."""
        result = wordcount.build(
            self.paths, 2, **{"checkpoint_interval": 0.5, "progress": False, "ui": False, **config}
        ).run()
        if wordcount.final_counts(result.output("counts")) != dict(self.expected):
            raise SystemExit(f"{name}: the counts differ from collections.Counter")
        return result.duration, [c.encode() for c in result.checkpoints if not c.final]


def describe(checkpoints: list[dict[str, Any]]) -> str:
    return ", ".join(
        f"{c['duration_ms']:.0f} (q {c['queueing_ms']:.0f} a {c['alignment_ms']:.0f} "
        f"w {c['write_ms']:.0f})"
        for c in checkpoints
    )


def summary(pooled: list[dict[str, Any]]) -> str:
    durations = [c["duration_ms"] for c in pooled]
    return (
        f"duration p50 {statistics.median(durations):.0f} ms, p99 "
        f"{nearest_rank(durations, 0.99):.0f} ms, max {max(durations):.0f} ms; write p50 "
        f"{statistics.median(c['write_ms'] for c in pooled):.0f} ms, queueing p50 "
        f"{statistics.median(c['queueing_ms'] for c in pooled):.0f} ms"
    )


if __name__ == "__main__":
    main()
