"""The cost of CURVE (``secure_channels``): the same jobs with and without it, in one run.

    python benchmarks/curve_cost.py                         # 6 rounds of ~5 s runs, p = 2
    python benchmarks/curve_cost.py --seconds 2 --repeat 6  # a quicker look

Two workloads at parallelism p: the keyed count (benchmarks/keyed_count.py: one hash
shuffle of small records, the throughput benchmark's job) and the ABS paper's topology
(benchmarks/paper_topology.py: six operators, three hash shuffles, chaining off, 6p
tasks: every record crosses four channels). Each is sized (from a probe without CURVE) to
run ``--seconds``; a round runs each workload with and without CURVE, in an order rotated
from round to round, so a drift of the machine falls on both alike. The figures are
same-round ratios with CURVE / without (processing time: submit to all output committed,
minus start-up; start-up: submit to first record), as median [IQR] over the rounds, and
each setting's throughput. Checkpoints every ``--interval`` s (the control plane carries
acks and triggers meanwhile). Every run's result is checked (exact counts). The tasks run
on the local launcher (``--launcher spark``: local Spark); tasks on one host exchange data
over Unix sockets, which CURVE encrypts as it does TCP.

Writes benchmarks/results/curve_cost.json (``benchmarks.results``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import keyed_count
import paper_topology
from eval_report import Spread, stopwatch

from benchmarks.results import write_result
from jobmanager.result import JobResult

Build = Callable[..., Any]
WORKLOADS: dict[str, tuple[Build, Callable[[JobResult, int], bool]]] = {
    "keyed count": (keyed_count.build, lambda r, n: bool(keyed_count.check(r, n)["correct"])),
    "paper topology": (paper_topology.build, paper_topology.check),
}


def run(workload: str, n: int, p: int, secure: bool, args: argparse.Namespace) -> JobResult:
    build, check = WORKLOADS[workload]
    result: JobResult = build(
        n,
        p,
        secure_channels=secure,
        checkpoint_interval=args.interval,
        launcher=args.launcher,
        progress=False,
        ui=False,
    ).run()
    if not check(result, n):
        raise SystemExit(f"wrong result: {workload} n={n} p={p} secure_channels={secure}")
    return result


def processing(result: JobResult) -> float:
    return result.duration - (result.startup_seconds or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=5.0, help="length of a run (default 5)")
    ap.add_argument("--repeat", type=int, default=6, help="interleaved rounds (default 6)")
    ap.add_argument("--parallelism", "-p", type=int, default=2)
    ap.add_argument("--interval", type=float, default=1.0, help="checkpoint interval, s")
    ap.add_argument("--launcher", choices=("local", "spark"), default="local")
    args = ap.parse_args()
    say = stopwatch()
    p = args.parallelism

    sizes: dict[str, int] = {}
    for workload in WORKLOADS:
        probe_n = 100_000
        rate = probe_n / max(0.05, processing(run(workload, probe_n, p, False, args)))
        sizes[workload] = int(rate * args.seconds)
        say(f"{workload}: {rate:,.0f} records/s without CURVE; runs of {sizes[workload]:,}")

    settings = [(w, s) for w in WORKLOADS for s in (False, True)]
    runs: dict[tuple[str, bool], list[JobResult]] = {k: [] for k in settings}
    for r in range(args.repeat):
        k = r % len(settings)
        for workload, secure in settings[k:] + settings[:k]:
            runs[(workload, secure)].append(run(workload, sizes[workload], p, secure, args))
        say(f"round {r + 1}/{args.repeat} done")

    figures: dict[str, Any] = {"parallelism": p, "seconds": args.seconds, "interval": args.interval}
    print(f"\nCURVE cost at p = {p}, {args.repeat} interleaved rounds, median [IQR]:\n")
    print(
        f"{'workload':16} {'time with/without':>20} {'start-up with/without':>24} "
        f"{'rec/s without':>16} {'rec/s with':>16}"
    )
    for workload in WORKLOADS:
        n = sizes[workload]
        plain, secure = runs[(workload, False)], runs[(workload, True)]
        time_ratio = Spread.of(
            processing(s) / processing(b) for s, b in zip(secure, plain, strict=True)
        )
        startup_ratio = Spread.of(
            (s.startup_seconds or 0.0) / max(1e-3, b.startup_seconds or 0.0)
            for s, b in zip(secure, plain, strict=True)
        )
        rate_plain = Spread.of(n / processing(b) for b in plain)
        rate_secure = Spread.of(n / processing(s) for s in secure)
        print(
            f"{workload:16} {time_ratio.fmt(3):>20} {startup_ratio.fmt(2):>24} "
            f"{rate_plain.median:>16,.0f} {rate_secure.median:>16,.0f}"
        )
        figures[workload] = {
            "records": n,
            "time_ratio": vars(time_ratio),
            "startup_ratio": vars(startup_ratio),
            "records_per_second_without": vars(rate_plain),
            "records_per_second_with": vars(rate_secure),
        }
    path = write_result("curve_cost", figures, rounds=args.repeat)
    say(f"wrote {path}")


if __name__ == "__main__":
    main()
