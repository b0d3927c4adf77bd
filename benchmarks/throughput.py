"""Throughput benchmark, one command, everything measured in one run on this machine.

    python benchmarks/throughput.py [--n 2000000] [--repeat 3] [--bytewax-venv ../bytewax-venv]

(a) the raw channel ceiling: records/s through one ZeroMQ channel (encode, send,
    receive, decode) between two processes, with our batching;
(b) the keyed running count (benchmarks/keyed_count.py) on absflow at parallelism
    1 and 2 (end to end: submit -> all output committed, on a running SparkSession);
(c) the same loop in plain Python in one process (the floor);
plus bytewax 0.21 on the same workload when its venv is given (see ../shared/peers),
the ratios (b)/(a), (b)/(c), (b)/bytewax, start-up time (submit -> first record),
peak RSS of the task processes, and task RSS under backpressure (a slow sink)
at N and 4N records.
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from channel_ceiling import measure_channel_ceiling
from keyed_count import VOCAB, build, check

from runtime import Dataflow
from runtime.sinks import Sink
from runtime.sources import GeneratorSource

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PEERS = os.path.join(os.path.dirname(REPO), "shared", "peers")


def plain_python(n: int) -> float:
    """(c): the peers' python_baseline loop (count + sink bookkeeping), records/s."""
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    sink_n = 0
    for i in range(n):
        w = f"w{(i * 7919) % VOCAB}"
        c = counts.get(w, 0) + 1
        counts[w] = c
        sink_n += 1
        last[w] = c
    dt = time.perf_counter() - t0
    assert sum(last.values()) == n and sink_n == n
    return n / dt


def absflow_run(n: int, parallelism: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    result = build(n, parallelism, progress=False).run()
    wall = time.perf_counter() - t0
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"absflow p={parallelism}: wrong result {got}")
    return {
        "records_per_s": n / wall,
        "wall_s": wall,
        "startup_s": result.startup_seconds,
        "processing_records_per_s": n / max(1e-9, wall - (result.startup_seconds or 0)),
        "peak_rss_mib": max(result.peak_rss.values()) / 2**20,
    }


def bytewax(venv: str, n: int, interval: float) -> dict[str, Any] | None:
    python = os.path.join(venv, "bin", "python")
    script = os.path.join(PEERS, "bytewax_wordcount.py")
    if not (os.path.exists(python) and os.path.exists(script)):
        return None
    out = subprocess.run(
        [python, script, "--n", str(n), "--interval-s", str(interval)],
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    for line in out.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


class SlowSink(Sink):
    """Sleeps per batch: upstream must be held back by backpressure, not by memory."""

    def write_batch(self, records: list[Any]) -> None:
        time.sleep(0.004)


def backpressure_rss(n: int) -> float:
    flow = Dataflow("backpressure", parallelism=1, progress=False)
    (
        flow.source(GeneratorSource(lambda i: f"payload-{i:012d}-" + "x" * 64, n))
        .map(lambda s: s.upper())
        .rebalance()
        .sink(SlowSink(), name="slow")
    )
    result = flow.run()
    return max(result.peak_rss.values()) / 2**20


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bytewax-venv", default=os.path.join(os.path.dirname(REPO), "bytewax-venv"))
    ap.add_argument(
        "--bytewax-result", default=None, help="a 'RESULT {...}' line of the peer script"
    )
    ap.add_argument("--skip-backpressure", action="store_true")
    args = ap.parse_args()
    n = args.n

    print(f"warming up the SparkSession ... (N = {n:,})", flush=True)
    build(10_000, 2, progress=False).run()

    rows: dict[str, list[float]] = {
        "a": [],
        "a_gen": [],
        "b1": [],
        "b2": [],
        "c": [],
        "bytewax": [],
    }
    startup: list[float] = []
    rss: list[float] = []
    for rep in range(args.repeat):
        rows["c"].append(plain_python(n))
        rows["a"].append(measure_channel_ceiling(n, 1000, pregenerated=True)["records_per_s"])
        rows["a_gen"].append(measure_channel_ceiling(n, 1000, pregenerated=False)["records_per_s"])
        for p in (1, 2):
            r = absflow_run(n, p)
            rows[f"b{p}"].append(r["records_per_s"])
            if r["startup_s"] is not None:
                startup.append(r["startup_s"])
            rss.append(r["peak_rss_mib"])
        if args.bytewax_result is None and rep == 0:
            bw = bytewax(args.bytewax_venv, n, 0)
            if bw is not None:
                rows["bytewax"].append(float(bw["records_per_s_execute"]))
        print(
            f"  round {rep + 1}/{args.repeat}: "
            + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items() if v),
            flush=True,
        )
    if args.bytewax_result:
        rows["bytewax"].append(
            float(json.loads(args.bytewax_result.split("RESULT ", 1)[-1])["records_per_s_execute"])
        )

    med = {k: statistics.median(v) for k, v in rows.items() if v}
    print(f"\n== throughput (records/s, median of {args.repeat}) ==")
    print(f"(a)  one channel, pre-built batches (codec + ZeroMQ):  {med['a']:>12,.0f}")
    print(f"(a') one channel, records formatted in the loop:         {med['a_gen']:>12,.0f}")
    print(f"(b)  absflow keyed running count, parallelism 1:        {med['b1']:>12,.0f}")
    print(f"(b)  absflow keyed running count, parallelism 2:        {med['b2']:>12,.0f}")
    print(f"(c)  plain Python loop, one process:                     {med['c']:>12,.0f}")
    if "bytewax" in med:
        print(f"     bytewax 0.21, 2 processes, no snapshots:            {med['bytewax']:>12,.0f}")
    print("\n== ratios ==")
    print(f"(a)/(c)           = {med['a'] / med['c']:.2f}   (target >= 1)")
    print(f"(b p2)/(a)        = {med['b2'] / med['a']:.2f}")
    print(f"(b p2)/(c)        = {med['b2'] / med['c']:.2f}")
    if "bytewax" in med:
        print(f"(b p2)/bytewax    = {med['b2'] / med['bytewax']:.2f}   (target >= 2.5, stretch 4)")
        print(f"(b p1)/bytewax    = {med['b1'] / med['bytewax']:.2f}")
    else:
        print(
            "(b)/bytewax: no bytewax figure (create ../bytewax-venv as ../shared/peers/README.md says)"
        )
    print("\n== start-up and memory ==")
    print(
        f"start-up, submit -> first record (running session): median {statistics.median(startup):.2f} s, "
        f"max {max(startup):.2f} s   (target <= 2 s)"
    )
    print(f"peak RSS of a task process (keyed count): {max(rss):.0f} MiB")
    if not args.skip_backpressure:
        small, large = backpressure_rss(n // 10), backpressure_rss(n * 4 // 10)
        print(
            f"slow sink (backpressure): peak task RSS {small:.0f} MiB at {n // 10:,} records, "
            f"{large:.0f} MiB at {n * 4 // 10:,} records (flat = bounded buffers)"
        )


if __name__ == "__main__":
    main()
