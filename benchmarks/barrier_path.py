"""Where an aligned checkpoint's time goes, step by step along the barriers' path.

    python benchmarks/barrier_path.py [--n 3000000] [--repeat 3] [--interval 0.1] \\
        [--config NAME JSON ...]   # e.g. --config unix '{"local_channels": true}'

Runs the paper's topology (benchmarks/paper_topology.py: source -> parse -> count ->
regroup -> total -> sink, chaining off, p = 2, 12 task processes, local launcher) with
ABS every ``--interval`` seconds, once per setting and round (the defaults, then each
``--config``; rounds interleaved), and pools the completed checkpoints of each setting.
Every checkpoint reports each task's part (``JobResult.checkpoints[i].tasks``: its
ack's figures), so per step it prints, in ms since the trigger (median and 90th
percentile over the checkpoints):

- ``first``: when the step's first barrier arrived at its earliest subtask (for a
  source: when it acted on the trigger);
- ``spread``: how much later it arrived at its latest subtask;
- ``hop``: ``first`` minus the moment the upstream step's earliest subtask had forwarded
  its barrier (its first barrier + alignment + sync): what the fastest barrier spent in
  the channel queues between the two steps;
- ``align``: the longest alignment among its subtasks (first to last barrier: how much
  later one upstream subtask's barrier came than another's);
- ``write``: the longest state capture and write.

And the checkpoint durations (p50 / p90 / p99) and how many completed per run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from eval_report import q as quantile
from paper_topology import build, check

STEPS = ("source", "parse", "count", "regroup", "total", "sink")


def step_of(task: str) -> str:
    return task.split("[", 1)[0]


def path_figures(checkpoints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per step: the figures above, one value per checkpoint."""
    rows: list[dict[str, Any]] = []
    upstream_forwarded: list[float] | None = None
    for step in STEPS:
        parts = [
            [t for name, t in c["tasks"].items() if step_of(name) == step] for c in checkpoints
        ]
        if not all(parts):
            continue
        first = [min(t["start_delay_ms"] for t in p) for p in parts]
        rows.append(
            {
                "step": step,
                "first": first,
                "spread": [
                    max(t["start_delay_ms"] for t in p) - f
                    for p, f in zip(parts, first, strict=True)
                ],
                "hop": first
                if upstream_forwarded is None
                else [f - u for f, u in zip(first, upstream_forwarded, strict=True)],
                "align": [max(t["alignment_ms"] for t in p) for p in parts],
                "write": [max(t["sync_ms"] + t["async_ms"] for t in p) for p in parts],
            }
        )
        upstream_forwarded = [
            min(t["start_delay_ms"] + t["alignment_ms"] + t["sync_ms"] for t in p) for p in parts
        ]
    return rows


def report(name: str, checkpoints: list[dict[str, Any]], runs: int) -> None:
    durations = [c["duration_ms"] for c in checkpoints]
    print(
        f"\n== {name}: {len(checkpoints)} checkpoints ({len(checkpoints) / runs:.0f} per run), "
        f"duration p50 / p90 / p99 {quantile(durations, 0.5):.0f} / "
        f"{quantile(durations, 0.9):.0f} / {quantile(durations, 0.99):.0f} ms"
    )
    print(
        f"{'step':9s} {'first':>14s} {'spread':>14s} {'hop':>14s} {'align':>14s} "
        f"{'write':>6s}   (ms: p50 p90; write: p50)"
    )
    for row in path_figures(checkpoints):
        cells = [
            f"{quantile(row[k], 0.5):7.1f}{quantile(row[k], 0.9):7.1f}"
            for k in ("first", "spread", "hop", "align")
        ]
        print(f"{row['step']:9s} {' '.join(cells)} {statistics.median(row['write']):6.1f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--n", type=int, default=3_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument(
        "--config",
        nargs=2,
        action="append",
        default=[],
        metavar=("NAME", "JSON"),
        help="another setting: JobConfig fields as JSON",
    )
    a = ap.parse_args()
    settings: dict[str, dict[str, Any]] = {"defaults": {}}
    settings.update({name: json.loads(text) for name, text in a.config})
    pooled: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    for r in range(a.repeat):
        for name, config in settings.items():
            result = build(
                a.n,
                2,
                progress=False,
                ui=False,
                launcher="local",
                checkpoint_interval=a.interval,
                **config,
            ).run()
            if not check(result, a.n):
                raise SystemExit(f"{name}: the sink did not see every record once")
            done = [c.encode() for c in result.checkpoints if not c.final]
            pooled[name].extend(done)
            print(f"round {r + 1}/{a.repeat} {name}: {len(done)} checkpoints", flush=True)
    for name, checkpoints in pooled.items():
        report(name, checkpoints, a.repeat)


if __name__ == "__main__":
    main()
