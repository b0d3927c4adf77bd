"""Checkpoint overhead and recovery time on the keyed running count.

    python benchmarks/checkpoint_overhead.py [--n 20000000] [--repeat 3] [--bytewax-n 2000000]
                                             [--bytewax-venv ../bytewax-venv]

The keyed running count of the throughput benchmark (N records, 10,000 keys,
parallelism 2) with checkpoints off and every 2 s, 1 s, 0.5 s and 0.1 s,
interleaved in one run (median of --repeat). Prints per interval: run time, the
overhead against no checkpoints, checkpoint duration p50 / p99, mean alignment
time, state size; bytewax 0.21 with 0.1 s snapshots beside it when its venv is
there (on --bytewax-n records: it is ~15x slower); then one run with a SIGKILL of a
counting task once its third checkpoint completed, printing the recovery time (kill ->
first record processed after the restore) and checking the result. N is large enough
that a run takes seconds (the start-up, ~0.1 s on a running session, is not counted).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import build, check
from throughput import REPO, bytewax

from jobmanager.faults import Kill

INTERVALS: list[float | None] = [None, 2.0, 1.0, 0.5, 0.1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def run(n: int, interval: float | None, faults: list[Any] | None = None) -> Any:
    config: dict[str, Any] = {"progress": False}
    if interval is not None:
        config["checkpoint_interval"] = interval
    result = build(n, 2, **config).run(faults=faults or [])
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"interval {interval}: wrong result {got}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--bytewax-n", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bytewax-venv", default=os.path.join(os.path.dirname(REPO), "bytewax-venv"))
    args = ap.parse_args()
    n = args.n

    print(f"warming up the SparkSession ... (N = {n:,}, parallelism 2)", flush=True)
    build(10_000, 2, progress=False).run()
    times: dict[float | None, list[float]] = {i: [] for i in INTERVALS}
    durations: dict[float | None, list[float]] = {i: [] for i in INTERVALS}
    alignment: dict[float | None, list[float]] = {i: [] for i in INTERVALS}
    state: dict[float | None, list[int]] = {i: [] for i in INTERVALS}
    counts: dict[float | None, list[int]] = {i: [] for i in INTERVALS}
    for rep in range(args.repeat):
        for interval in INTERVALS:
            r = run(n, interval)
            # the processing time: first record -> all output committed
            times[interval].append(r.duration - (r.startup_seconds or 0.0))
            regular = [c for c in r.checkpoints if not c["final"]]
            durations[interval] += [c["duration_ms"] for c in regular]
            alignment[interval] += [c["mean_alignment_ms"] for c in regular]
            state[interval] += [c["state_bytes"] for c in regular]
            counts[interval].append(len(regular))
        print(
            f"  round {rep + 1}/{args.repeat}: "
            + ", ".join(
                f"{'off' if i is None else f'{i}s'} {times[i][-1]:.2f}s" for i in INTERVALS
            ),
            flush=True,
        )

    base = statistics.median(times[None])
    print(f"\n== keyed running count, {n:,} records, parallelism 2, median of {args.repeat} ==")
    print(
        f"{'interval':>9} {'run s':>7} {'rec/s':>10} {'overhead':>9} {'chk/run':>8} "
        f"{'p50 ms':>8} {'p99 ms':>8} {'align ms':>9} {'state KiB':>10}"
    )
    for interval in INTERVALS:
        t = statistics.median(times[interval])
        label = "off" if interval is None else f"{interval} s"
        if interval is None:
            print(f"{label:>9} {t:>7.2f} {n / t:>10,.0f} {'-':>9}")
            continue
        d = durations[interval]
        print(
            f"{label:>9} {t:>7.2f} {n / t:>10,.0f} {100 * (t / base - 1):>8.1f}% "
            f"{statistics.median(counts[interval]):>8.0f} {percentile(d, 50):>8.1f} {percentile(d, 99):>8.1f} "
            f"{statistics.mean(alignment[interval]) if alignment[interval] else 0:>9.2f} "
            f"{statistics.median(state[interval]) / 1024 if state[interval] else 0:>10.0f}"
        )
    print("targets: overhead <= 5 % at 1 s, <= 20 % at 0.1 s; checkpoint p99 <= 250 ms")

    bw = bytewax(args.bytewax_venv, args.bytewax_n, 0.1)
    if bw is not None:
        ours = n / statistics.median(times[0.1])
        print(
            f"\nbytewax 0.21 with 0.1 s snapshots ({args.bytewax_n:,} records): "
            f"{bw['records_per_s_execute']:,} records/s; "
            f"absflow at 0.1 s: {ours:,.0f} records/s = {ours / bw['records_per_s_execute']:.1f}x "
            f"(target >= 5x)"
        )
    else:
        print("\n(no bytewax figure: create ../bytewax-venv as ../shared/peers/README.md says)")

    r = run(n, 0.1, faults=[Kill("count[1]", after_checkpoint=3)])
    print("\n== recovery ==")
    for restart in r.restarts:
        rec = restart.recovery_seconds
        print(
            f"killed count[1] (SIGKILL) -> processing again after restoring checkpoint "
            f"{restart.restored_checkpoint}: {rec:.2f} s (target <= 3 s)"
            if rec is not None
            else "killed, but no record processed after the restore was seen"
        )
    print(f"result after the kill: {check(r, n)}")


if __name__ == "__main__":
    main()
