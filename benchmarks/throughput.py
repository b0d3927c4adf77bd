"""Throughput benchmark, one command, everything measured in one run on this machine.

    python benchmarks/throughput.py [--n 2000000] [--repeat 3] [--bytewax-venv ../bytewax-venv]
    # steady state (start-up a small part), the issue-18 comparison:
    python benchmarks/throughput.py --n 20000000 --repeat 5 --bytewax-venv /tmp/ev-bytewax-venv \
        --skip-ceiling --skip-backpressure

Interleaved rounds (``--repeat``), each running in turn:
(b) the keyed running count (benchmarks/keyed_count.py) on absflow at parallelism
    1 and 2, on a running SparkSession (``--launcher local``: local task processes);
(c) the same loop in plain Python in one process (../shared/peers/python_baseline.py,
    the floor);
    bytewax 0.21 on the same workload when its venv is given (see ../shared/peers);
(a) the raw channel ceiling: records/s through one ZeroMQ channel (encode, send,
    receive, decode) between two processes, with our batching (``--skip-ceiling``).
With ``--compare-scheduling`` each round also runs (b) at parallelism 2 with
``task_scheduling="normal"`` (the OS's policy instead of SCHED_BATCH), paired per round;
with ``--tuned JSON`` (job settings, e.g. ``'{"batch_size": 2000, "channel_hwm": 6}'``),
(b) at parallelism 2 with those settings: what the defaults leave on the table, paired
per round (bigger batches and deeper queues also lengthen aligned checkpoints at full
load: benchmarks/inflight.py measures that side).
Each figure is printed as median [min-max] over the rounds, in records/s over the
processing time (first record -> all output committed) and submit -> end; then the
ratios (b)/(a), (b)/(c), (b)/bytewax, start-up time (submit -> first record), peak RSS
of the task processes, the task processes' CPU time per record (``--launcher local``),
and task RSS under backpressure (a slow sink) at N/10 and 4N/10 records. It writes
every round's figures to benchmarks/results/throughput.json; ``python
benchmarks/render.py`` renders docs/benchmarks.md and the README's headline from it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from channel_ceiling import measure_channel_ceiling
from keyed_count import VOCAB, build, check
from results import write_result

from runtime import Dataflow
from runtime.sinks import Sink
from runtime.sources import GeneratorSource

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _find_peers() -> str:
    """../shared/peers of the checkout, also from a worktree nested one level deeper."""
    here = os.path.dirname(REPO)
    for _ in range(3):
        candidate = os.path.join(here, "shared", "peers")
        if os.path.isdir(candidate):
            return candidate
        here = os.path.dirname(here)
    return os.path.join(os.path.dirname(REPO), "shared", "peers")


PEERS = os.environ.get("ABSFLOW_PEERS") or _find_peers()


def plain_python(n: int) -> float:
    """(c): the peers' python_baseline loop (count + sink bookkeeping), records/s, in a
    process of its own (../shared/peers/python_baseline.py; this loop when it is absent)."""
    script = os.path.join(PEERS, "python_baseline.py")
    if os.path.exists(script):
        got = _result_line(
            subprocess.run(
                [sys.executable, script, "--n", str(n)],
                capture_output=True,
                text=True,
                timeout=3600,
                check=True,
            ).stdout
        )
        if got is None or not got["correct"]:
            raise SystemExit(f"python_baseline.py: no correct RESULT line ({got})")
        return float(got["records_per_s_execute"])
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


def _result_line(out: str) -> dict[str, Any] | None:
    for line in out.splitlines():
        if line.startswith("RESULT "):
            got: dict[str, Any] = json.loads(line[7:])
            return got
    return None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def absflow_run(n: int, parallelism: int, launcher: str, **config: Any) -> dict[str, Any]:
    """One run of the keyed count (``config``: JobConfig settings): records/s submit -> end
    and over the processing time (first record -> all output committed); with the local
    launcher also the task processes' CPU seconds (this process's children, reaped)."""
    cpu0 = _children_cpu()
    t0 = time.perf_counter()
    result = build(n, parallelism, progress=False, launcher=launcher, **config).run()
    wall = time.perf_counter() - t0
    cpu = _children_cpu() - cpu0 if launcher == "local" else None
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"absflow p={parallelism}: wrong result {got}")
    startup = result.startup_seconds or 0.0
    return {
        "records_per_s": n / wall,
        "wall_s": wall,
        "startup_s": result.startup_seconds,
        "processing_records_per_s": n / max(1e-9, wall - startup),
        "peak_rss_mib": max(result.peak_rss.values()) / 2**20,
        "task_cpu_s": cpu,
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
        timeout=3600,
    ).stdout
    got = _result_line(out)
    if got is not None and not got.get("correct"):
        raise SystemExit(f"bytewax: wrong result {got}")
    return got


class SlowSink(Sink):
    """Sleeps per batch: upstream must be held back by backpressure, not by memory."""

    def write_batch(self, records: list[Any]) -> None:
        time.sleep(0.004)


def backpressure_rss(n: int, launcher: str) -> float:
    flow = Dataflow("backpressure", parallelism=1, progress=False, launcher=launcher)
    (
        flow.source(GeneratorSource(lambda i: f"payload-{i:012d}-" + "x" * 64, n))
        .map(lambda s: s.upper())
        .rebalance()
        .sink(SlowSink(), name="slow")
    )
    result = flow.run()
    return max(result.peak_rss.values()) / 2**20


def spread(values: list[float]) -> str:
    """``median [min-max]`` of records/s figures, in k or M."""

    def short(v: float) -> str:
        return f"{v / 1e6:.2f} M" if v >= 1e6 else f"{v / 1e3:.0f} k"

    if not values:
        return "n/a"
    med = statistics.median(values)
    if len(values) == 1:
        return short(med)
    return f"{short(med)} [{short(min(values))}-{short(max(values))}]"


def ratio(a: list[float], b: list[float]) -> str:
    """Median of the per-round ratios a/b, with their min-max (rounds pair the figures
    measured side by side)."""
    pairs = [x / y for x, y in zip(a, b, strict=False) if y]
    if not pairs:
        return "n/a"
    med = statistics.median(pairs)
    return f"{med:.2f} [{min(pairs):.2f}-{max(pairs):.2f}]" if len(pairs) > 1 else f"{med:.2f}"


def run_rounds(
    args: argparse.Namespace,
) -> tuple[dict[str, list[float]], list[float], list[float], dict[int, list[float]]]:
    """The interleaved rounds: per figure its value in every round."""
    n, launcher = args.n, args.launcher
    # Per round: submit -> end ("b1", "b2", "bytewax"), processing time ("b1p", "b2p").
    rows: dict[str, list[float]] = {
        k: []
        for k in [
            "a",
            "a_gen",
            "b1",
            "b1p",
            "b2",
            "b2p",
            "b2n",
            "b2np",
            "b2t",
            "b2tp",
            "c",
            "bytewax",
        ]
    }
    startup: list[float] = []
    rss: list[float] = []
    cpu_us: dict[int, list[float]] = {1: [], 2: []}
    for rep in range(args.repeat):
        for p in (1, 2):
            r = absflow_run(n, p, launcher)
            rows[f"b{p}"].append(r["records_per_s"])
            rows[f"b{p}p"].append(r["processing_records_per_s"])
            if r["startup_s"] is not None:
                startup.append(r["startup_s"])
            rss.append(r["peak_rss_mib"])
            if r["task_cpu_s"] is not None:
                cpu_us[p].append(r["task_cpu_s"] / n * 1e6)
        if args.compare_scheduling:  # the same p = 2 run under the OS's scheduling policy
            r = absflow_run(n, 2, launcher, task_scheduling="normal")
            rows["b2n"].append(r["records_per_s"])
            rows["b2np"].append(r["processing_records_per_s"])
        if args.tuned:  # the same p = 2 run with the given settings
            r = absflow_run(n, 2, launcher, **args.tuned)
            rows["b2t"].append(r["records_per_s"])
            rows["b2tp"].append(r["processing_records_per_s"])
        rows["c"].append(plain_python(n))
        if args.bytewax_result is None:
            bw = bytewax(args.bytewax_venv, args.bytewax_n or n, 0)
            if bw is not None:
                rows["bytewax"].append(float(bw["records_per_s_execute"]))
        if not args.skip_ceiling:
            rows["a"].append(measure_channel_ceiling(n, 1000, pregenerated=True)["records_per_s"])
            rows["a_gen"].append(
                measure_channel_ceiling(n, 1000, pregenerated=False)["records_per_s"]
            )
        print(
            f"  round {rep + 1}/{args.repeat}: "
            + ", ".join(f"{k} {v[-1]:,.0f}" for k, v in rows.items() if v),
            flush=True,
        )
    return rows, startup, rss, cpu_us


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--bytewax-venv", default=os.path.join(os.path.dirname(REPO), "bytewax-venv"))
    ap.add_argument(
        "--bytewax-result", default=None, help="a 'RESULT {...}' line of the peer script"
    )
    ap.add_argument(
        "--bytewax-n",
        type=int,
        default=None,
        help="records for bytewax (default --n): at ~180 k records/s, 20 M take ~2 min a "
        "round, and a few million are already steady state",
    )
    ap.add_argument("--launcher", choices=("spark", "local"), default="spark")
    ap.add_argument("--skip-ceiling", action="store_true", help="no (a) channel ceiling")
    ap.add_argument("--skip-backpressure", action="store_true")
    ap.add_argument(
        "--compare-scheduling",
        action="store_true",
        help="also run p = 2 with task_scheduling='normal' (the OS's policy) every round",
    )
    ap.add_argument(
        "--tuned",
        type=json.loads,
        default=None,
        help="job settings as JSON for one more p = 2 run every round, e.g. "
        '\'{"batch_size": 2000, "channel_hwm": 6}\'',
    )
    args = ap.parse_args()
    n, launcher = args.n, args.launcher

    print(f"warming up ({launcher}) ... (N = {n:,}, {args.repeat} interleaved rounds)", flush=True)
    build(10_000, 2, progress=False, launcher=launcher).run()

    rows, startup, rss, cpu_us = run_rounds(args)
    if args.bytewax_result:
        got = json.loads(args.bytewax_result.split("RESULT ", 1)[-1])
        rows["bytewax"] = [float(got["records_per_s_execute"])] * args.repeat

    print(f"\n== throughput, records/s: median [min-max] of {args.repeat} rounds, N = {n:,} ==")
    print(f"{'':56}{'processing':>24}{'submit -> end':>24}")
    line = "{:<56}{:>24}{:>24}"
    for p in (1, 2):
        name = f"(b)  absflow keyed running count, parallelism {p}"
        print(line.format(name, spread(rows[f"b{p}p"]), spread(rows[f"b{p}"])))
    if rows["b2n"]:
        name = "(b)  parallelism 2, task_scheduling='normal'"
        print(line.format(name, spread(rows["b2np"]), spread(rows["b2n"])))
    if rows["b2t"]:
        print(f"(b') parallelism 2 with {json.dumps(args.tuned)}:")
        print(line.format("", spread(rows["b2tp"]), spread(rows["b2t"])))
    print(line.format("(c)  plain Python loop, one process (the floor)", spread(rows["c"]), ""))
    if rows["bytewax"]:
        print(
            line.format(
                f"     bytewax 0.21, 2 processes, no snapshots, N = {args.bytewax_n or n:,}",
                "",
                spread(rows["bytewax"]),
            )
        )
    if rows["a"]:
        print(
            line.format(
                "(a)  one channel, pre-built batches (codec + ZeroMQ)", spread(rows["a"]), ""
            )
        )
        print(
            line.format(
                "(a') one channel, records formatted in the loop", spread(rows["a_gen"]), ""
            )
        )
    print("\n== ratios per round: median [min-max] ==")
    print(f"(b p2)/(c), processing      = {ratio(rows['b2p'], rows['c'])}   (target >= 1.0)")
    print(f"(b p2)/(c), submit -> end   = {ratio(rows['b2'], rows['c'])}")
    if rows["b2n"]:
        print(f"(b p2)/(b p2 'normal'), proc = {ratio(rows['b2p'], rows['b2np'])}")
    if rows["b2t"]:
        print(f"(b' p2)/(c), processing     = {ratio(rows['b2tp'], rows['c'])}")
        print(f"(b' p2)/(b p2), processing  = {ratio(rows['b2tp'], rows['b2p'])}")
    if rows["bytewax"]:
        print(
            f"(b p2)/bytewax, submit->end = {ratio(rows['b2'], rows['bytewax'])}   (target >= 10)"
        )
        print(f"(b p2)/bytewax, processing  = {ratio(rows['b2p'], rows['bytewax'])}")
        if rows["b2t"]:
            print(f"(b' p2)/bytewax, submit->end= {ratio(rows['b2t'], rows['bytewax'])}")
        print(f"(b p1)/bytewax, submit->end = {ratio(rows['b1'], rows['bytewax'])}")
    else:
        print("(b)/bytewax: no bytewax figure (pass --bytewax-venv, see ../shared/peers/README.md)")
    if rows["a"]:
        print(f"(a)/(c)                     = {ratio(rows['a'], rows['c'])}")
        print(f"(b p2)/(a), processing      = {ratio(rows['b2p'], rows['a'])}")
    print("\n== start-up, CPU and memory ==")
    print(
        f"start-up, submit -> first record: median {statistics.median(startup):.2f} s, "
        f"max {max(startup):.2f} s   (target <= 2 s)"
    )
    for p, figures in cpu_us.items():
        if figures:
            print(
                f"task processes' CPU per record, parallelism {p} (start-up included): "
                f"median {statistics.median(figures):.2f} µs"
            )
    print(f"peak RSS of a task process (keyed count): {max(rss):.0f} MiB")
    bp: dict[str, Any] | None = None
    if not args.skip_backpressure:
        small = backpressure_rss(n // 10, launcher)
        large = backpressure_rss(n * 4 // 10, launcher)
        bp = {"records": [n // 10, n * 4 // 10], "peak_rss_mib": [small, large]}
        print(
            f"slow sink (backpressure): peak task RSS {small:.0f} MiB at {n // 10:,} records, "
            f"{large:.0f} MiB at {n * 4 // 10:,} records (flat = bounded buffers)"
        )
    figures = {
        "records": n,
        "launcher": launcher,
        "per_round": {k: [round(x, 1) for x in v] for k, v in rows.items() if v},
        "tuned": args.tuned,
        "bytewax": bytewax_note(args, rows["bytewax"]),
        "startup_s": [round(x, 3) for x in startup],
        "peak_rss_mib": [round(x, 1) for x in rss],
        "task_cpu_us_per_record": {str(p): [round(x, 3) for x in v] for p, v in cpu_us.items()},
        "backpressure": bp,
    }
    path = write_result("throughput", figures, rounds=args.repeat)
    print(f"wrote {path}; `python benchmarks/render.py` puts it in docs/benchmarks.md")


def bytewax_note(args: argparse.Namespace, figures: list[float]) -> dict[str, Any]:
    """Where the bytewax figure came from, or why there is none."""
    if args.bytewax_result:
        return {"measured": True, "source": "--bytewax-result", "records": args.bytewax_n or args.n}
    if figures:
        return {"measured": True, "source": "peer script", "records": args.bytewax_n or args.n}
    return {
        "measured": False,
        "reason": f"no bytewax venv at {args.bytewax_venv} (see ../shared/peers/README.md)",
    }


if __name__ == "__main__":
    main()
