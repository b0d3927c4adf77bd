"""Loops: the two loop examples with checkpoints off and every 0.5 s, and one kill each.

    python benchmarks/loops.py [--collatz-n 30000] [--vertices 60000] [--edges 48000] [--repeat 3]

For ``examples/collatz.py`` and ``examples/connected_components.py`` (parallelism 2),
runs without checkpoints and with checkpoints every 0.5 s are interleaved in one run
(median of --repeat), every result checked. Prints per run kind: run time, loop
records/s (records read by the loop heads: entries plus feedback, i.e. passes through
the loop), the overhead of checkpointing, checkpoint duration p50/p99, and the
back-edge log per checkpoint (records and bytes, p50/max: what cyclic ABS stores
besides operator state). Then one run each with a SIGKILL of a loop-body task after
checkpoint 2: the time from the kill to the first record processed after the restore,
and whether the output still equals the direct computation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
)

import collatz
import connected_components as cc

from jobmanager.faults import Kill
from jobmanager.result import JobResult
from runtime import Dataflow

INTERVALS: list[float | None] = [None, 0.5]


class Workload:
    def __init__(
        self,
        name: str,
        build: Callable[..., Dataflow],
        check: Callable[[JobResult], bool],
        kill: str,
    ) -> None:
        self.name, self.build, self.check, self.kill = name, build, check, kill


def collatz_workload(n: int) -> Workload:
    expected = {i: collatz.steps_directly(i) for i in range(1, n + 1)}

    def check(result: JobResult) -> bool:
        out = result.output("steps")
        return len(out) == n and dict(out) == expected

    return Workload(
        f"collatz 1..{n:,}",
        lambda **config: collatz.build(n, 2, **config),
        check,
        "step[1]",
    )


def cc_workload(vertices: int, edges: int) -> Workload:
    graph = cc.make_edges(vertices, edges)
    expected = cc.union_find(graph)

    def check(result: JobResult) -> bool:
        updates = result.output("labels")
        component: dict[int, int] = {}
        for vertex, label in updates:
            component[vertex] = min(label, component.get(vertex, label))
        return component == expected and len(set(updates)) == len(updates)

    return Workload(
        f"connected components {vertices:,} vertices, {edges:,} edges",
        lambda **config: cc.build(graph, 2, **config),
        check,
        "propagate[1]",
    )


def loop_records(result: JobResult) -> int:
    return sum(
        m["records_in"] for task, m in result.task_metrics.items() if task.startswith("loop[")
    )


def config_for(interval: float | None) -> dict[str, Any]:
    return {"checkpoint_interval": interval}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def label(interval: float | None) -> str:
    return "off" if interval is None else f"{interval} s"


def measure(w: Workload, repeat: int) -> None:
    runs: dict[float | None, list[JobResult]] = {i: [] for i in INTERVALS}
    for rep in range(repeat):
        line = []
        for interval in INTERVALS:
            result = w.build(**config_for(interval)).run()
            if not w.check(result):
                raise SystemExit(f"{w.name}: wrong output with checkpoints {label(interval)}")
            runs[interval].append(result)
            line.append(f"{label(interval)} {result.duration:.2f}s")
        print(f"  round {rep + 1}/{repeat}: " + ", ".join(line), flush=True)
    base = statistics.median(r.duration for r in runs[None])
    print(f"\n== {w.name}, parallelism 2, median of {repeat} ==")
    print(
        f"{'checkpoints':>11} {'run s':>7} {'loop rec/s':>11} {'overhead':>9} {'chk':>4} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'log rec p50/max':>16} {'log KiB p50/max':>16}"
    )
    for interval in INTERVALS:
        rs = runs[interval]
        duration = statistics.median(r.duration for r in rs)
        rate = statistics.median(loop_records(r) / r.duration for r in rs)
        row = f"{label(interval):>11} {duration:7.2f} {rate:11,.0f}"
        if interval is None:
            print(row + f" {'-':>9}")
            continue
        chks = [c.encode() for r in rs for c in r.checkpoints if not c.final]
        durations = [c["duration_ms"] for c in chks]
        log_records = [c.get("backedge_records", 0) for c in chks]
        log_kib = [c.get("backedge_bytes", 0) / 1024 for c in chks]
        print(
            row + f" {(duration / base - 1) * 100:8.1f}% {len(chks) // len(rs):4d} "
            f"{pct(durations, 0.5):8.1f} {pct(durations, 0.99):8.1f} "
            f"{pct(log_records, 0.5):>8,.0f}/{max(log_records, default=0):<7,} "
            f"{pct(log_kib, 0.5):>8.1f}/{max(log_kib, default=0):<7.1f}"
        )
    result = w.build(checkpoint_interval=0.5).run(faults=[Kill(w.kill, after_checkpoint=2)])
    ok = w.check(result)
    for r in result.restarts:
        rec = f"{r.recovery_seconds:.2f} s" if r.recovery_seconds is not None else "n/a"
        print(
            f"kill {w.kill} after checkpoint 2 -> processing again after restoring "
            f"checkpoint {r.restored_checkpoint}: {rec}"
        )
    if not result.restarts:
        print(f"kill {w.kill}: the job finished before the kill fired")
    print(f"output after the kill equals the direct computation: {'YES' if ok else 'NO'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--collatz-n", type=int, default=30_000)
    ap.add_argument("--vertices", type=int, default=60_000)
    ap.add_argument("--edges", type=int, default=48_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    for w in (collatz_workload(args.collatz_n), cc_workload(args.vertices, args.edges)):
        print(f"\n### {w.name}", flush=True)
        measure(w, args.repeat)


if __name__ == "__main__":
    main()
