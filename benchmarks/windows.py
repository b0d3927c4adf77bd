"""Windowed counts: tumbling and session windows over out-of-order input, next to bytewax.

    python benchmarks/windows.py [--n 1000000] [--repeat K] [--launcher local]
        [--bytewax-venv ../bytewax-venv]

Workload: N records ``(key, ts)``, 10,000 keys (``i * 7919 % 10000``), event time
``i // 10`` ms plus a jitter below 500 ms (out of order; ``max_delay=500``, so nothing is
late); a tumbling count (60 s windows) and a session count (3 s gap) per key, at
parallelism 1 and 2, without checkpoints and with one every 0.5 s. Each run is checked:
the final window counts add up to N. Figures: records/s (submit to all output committed)
and peak task RSS at N and 2N records (window state is freed as the watermark passes, so
RSS should not grow with N). bytewax 0.21's ``count_window`` on the same input runs
from its own venv (``benchmarks/peers/bytewax_windows.py``) when the venv exists.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runtime import Dataflow
from runtime.sources import GeneratorSource
from runtime.window_kinds import Session, Tumbling, WindowKind

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KEYS = 10_000
TUMBLE_MS = 60_000
GAP_MS = 3_000
MAX_DELAY_MS = 500
LAUNCHER: dict[str, Any] = {}  # --launcher local: the Spark-free harness


def record(i: int) -> tuple[str, int]:
    return (f"k{(i * 7919) % KEYS}", i // 10 + (i * 104_729) % MAX_DELAY_MS)


def build(n: int, parallelism: int, kind: WindowKind, **config: Any) -> Dataflow:
    flow = Dataflow("windows", parallelism=parallelism, progress=False, **config)
    (
        flow.source(GeneratorSource(record, n), name="events")
        .assign_timestamps(lambda r: r[1], max_delay=MAX_DELAY_MS, name="event_time")
        .key_by(lambda r: r[0])
        .window(kind, name="windows")
        .count()
        .collect("counts")
    )
    return flow


def absflow_run(n: int, parallelism: int, kind: WindowKind, interval: float) -> dict[str, Any]:
    config: dict[str, Any] = {"checkpoint_interval": interval} if interval else {}
    config.update(LAUNCHER)
    t0 = time.perf_counter()
    result = build(n, parallelism, kind, **config).run()
    wall = time.perf_counter() - t0
    counts = result.output("counts")
    total = sum(c for _k, _s, _e, c in counts)
    if total != n:
        raise SystemExit(
            f"absflow {kind} p={parallelism}: window counts add up to {total}, not {n}"
        )
    return {
        "records_per_s": n / wall,
        "processing_records_per_s": n / max(1e-9, wall - (result.startup_seconds or 0)),
        "windows": len(counts),
        "peak_rss_mib": max(result.peak_rss.values()) / 2**20,
    }


def bytewax(venv: str, n: int, kind: str, interval: float, timeout: float) -> dict[str, Any] | None:
    """bytewax's figures, or, when it does not finish within ``timeout`` seconds, an
    upper bound of its rate (``n / timeout``, flagged ``timed_out``)."""
    python = os.path.join(venv, "bin", "python")
    script = os.path.join(REPO, "benchmarks", "peers", "bytewax_windows.py")
    if not os.path.exists(python):
        return None
    args = [python, script, "--n", str(n), "--kind", kind, "--interval-s", str(interval)]
    try:
        out = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"bytewax {kind} interval {interval}: not done after {timeout:.0f} s")
        return {"records_per_s": n / timeout, "timed_out": True, "correct": True, "windows": 0}
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    print(f"bytewax {kind}: no result ({out.stderr.strip().splitlines()[-1:]})")
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--bytewax-venv", default=os.path.join(os.path.dirname(REPO), "bytewax-venv"))
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds, interleaved (every run once per round): median and min-max per run",
    )
    ap.add_argument("--launcher", help="'local': task processes without Spark (the harness)")
    ap.add_argument("--bytewax-n", type=int, default=None, help="records for bytewax (default --n)")
    ap.add_argument(
        "--bytewax-timeout",
        type=float,
        default=600,
        help="seconds per bytewax run; a run past it counts as at most n/timeout records/s",
    )
    args = ap.parse_args()
    if args.launcher:
        LAUNCHER["launcher"] = args.launcher
    n = args.n
    kinds: dict[str, WindowKind] = {"tumbling": Tumbling(TUMBLE_MS), "session": Session(GAP_MS)}
    absflow_run(2_000, 1, kinds["tumbling"], 0.0)  # warm-up: the Spark session starts here
    print(f"{n:,} records, {KEYS:,} keys, out of order by < {MAX_DELAY_MS} ms")
    runs: dict[str, list[dict[str, Any]]] = {}
    for _round in range(max(1, args.repeat)):
        for name, kind in kinds.items():
            for interval in (0.0, 0.5):
                chk = f"chk {interval}s" if interval else "no chk"
                for p in (1, 2):
                    r = absflow_run(n, p, kind, interval)
                    runs.setdefault(f"absflow {name} p={p} {chk}", []).append(r)
                bw_n = args.bytewax_n or n
                bw = bytewax(args.bytewax_venv, bw_n, name, interval, args.bytewax_timeout)
                if bw is not None:
                    if not bw.get("correct"):
                        # its EventClock advances the watermark with system time too, so
                        # a slow run drops records as late (it counts fewer, not more)
                        print(f"bytewax {name} {chk}: window counts do not add up to N")
                    bw.setdefault("processing_records_per_s", float("nan"))
                    bw.setdefault("peak_rss_mib", float("nan"))
                    runs.setdefault(f"bytewax 0.21 {name} {chk}", []).append(bw)
    print(
        f"{'run (median, min-max records/s)':<38} {'records/s':>12} {'min-max':>21} "
        f"{'processing':>12} {'windows':>9} {'peak RSS':>9}"
    )
    for label, results in runs.items():
        if any(r.get("timed_out") for r in results):
            label += " (<=: timed out)"
        rates = sorted(r["records_per_s"] for r in results)
        proc = statistics.median(r["processing_records_per_s"] for r in results)
        rss = max(r["peak_rss_mib"] for r in results)
        print(
            f"{label:<38} {statistics.median(rates):>12,.0f} "
            f"{f'{rates[0]:,.0f}-{rates[-1]:,.0f}':>21} {proc:>12,.0f} "
            f"{results[0]['windows']:>9,} {rss:>7.0f} M"
        )
    print("\nabsflow / bytewax, records/s (submit to end), median of the runs:")
    for name in kinds:
        for chk in ("no chk", "chk 0.5s"):
            peer = runs.get(f"bytewax 0.21 {name} {chk}")
            if not peer:
                continue
            theirs = statistics.median(r["records_per_s"] for r in peer)
            for p in (1, 2):
                ours = statistics.median(
                    r["records_per_s"] for r in runs[f"absflow {name} p={p} {chk}"]
                )
                bound = " (at least)" if any(r.get("timed_out") for r in peer) else ""
                print(f"  {name} p={p} {chk}: {ours / theirs:.1f}x{bound}")
    print("\npeak task RSS against records (tumbling, p=1, checkpoints every 0.5 s):")
    for size in (n, 2 * n):
        r = absflow_run(size, 1, kinds["tumbling"], 0.5)
        print(f"  {size:>12,} records: {r['peak_rss_mib']:.0f} MiB")


if __name__ == "__main__":
    main()
