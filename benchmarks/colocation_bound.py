"""What the keyed count at p = 2 could reach on this machine with no runtime at all, in
its two process layouts, beside the job itself: bounds for slot sharing and for the
runtime's own cost.

    python benchmarks/colocation_bound.py [--n 20000000] [--repeat 5] [--batch 1000 4000]
        [--start spawn|fork] [--skip-job]

Each round runs, interleaved, for each frame size in ``--batch``:

* **four processes** (the job's layout today): two sources generate records i, i + 2, ...
  (the keyed count's records), partition them by key with absflow's `HashPartitioner`
  and send frames of ``batch`` records, msgpack-framed by `channels.messages`, over
  ZeroMQ (Unix sockets, the job's high-water mark) to two counting processes (the running
  count and the sink's bookkeeping, as the job does);
* **two processes, co-located** (Flink's slot sharing): process i generates its half,
  counts its own key half in place and sends the other half in frames of ``batch``
  records to the other process, whose half it counts as it arrives;
* **the job**: the keyed count itself (benchmarks/keyed_count.py) at p = 2 on the local
  launcher, ``batch_size`` = ``batch``, over its processing time (first record -> end);

and the plain-Python floor (``../shared/peers/python_baseline.py``) once. The bare
layouts have no checkpoints, control plane or metrics: only the per-record work and the
frames a job in that layout could not avoid, under the job's scheduling policy
(``task_scheduling="batch"``) and the job's high-water mark, in fresh interpreters as the
job's tasks are (the local launcher starts each task with ``subprocess``; Spark forks its
Python workers from a daemon that has not imported absflow); ``--start fork`` runs them
as copies of this process instead, which share its imported code. Each run is timed from
a common start once every process has set up its sockets. Printed: median [min-max]
records/s over the rounds and each layout's ratio to the floor per round; each run checks
sum(last counts) == N.
"""

from __future__ import annotations

import argparse
import functools
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import build, check, word
from throughput import plain_python

from channels.messages import decode_records, encode_data
from channels.partitioners import HashPartitioner
from runtime.config import JobConfig
from runtime.scheduling import task_scheduling

P, MAX_PARALLELISM = 2, 128
END = b"end"
WAIT = 600.0  # seconds a bare run may take before the benchmark gives up on it
HWM = JobConfig().channel_hwm  # the job's high-water mark, on both sides of a channel


def identity(w: str) -> str:
    return w


class Counter:
    """The counting side: the running count (AggregateOperator's fast path) and the sink
    (CountingSink.write_batch)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.last: dict[str, int] = {}
        self.seen = 0

    def count(self, records: list[Any]) -> None:
        get, counts = self.counts.get, self.counts
        emitted: list[tuple[str, int]] = []
        append = emitted.append
        for r in records:
            c = get(r, 0) + 1
            counts[r] = c
            append((r, c))
        self.seen += len(emitted)
        last = self.last
        for k, c in emitted:
            last[k] = c

    def take(self, frame: bytes) -> bool:
        """Count a data frame's records; whether the frame was the end marker instead."""
        if frame == END:
            return True
        self.count(decode_records(frame))
        return False


def gate_socket(ctx: zmq.Context[Any], directory: str, index: int) -> zmq.Socket[Any]:
    """Process ``index``'s input: a PULL socket bound in ``directory``."""
    gate: zmq.Socket[Any] = ctx.socket(zmq.PULL)
    gate.setsockopt(zmq.RCVHWM, HWM)
    gate.bind(f"ipc://{directory}/{index}")
    return gate


def push_socket(ctx: zmq.Context[Any], directory: str, target: int) -> zmq.Socket[Any]:
    """A channel to process ``target``'s gate."""
    push: zmq.Socket[Any] = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, HWM)
    push.connect(f"ipc://{directory}/{target}")
    return push


def frames_of(index: int, n: int, batch: int) -> Any:
    """Source i's records, partitioned by key: yields (target, records) per frame,
    ``batch`` records each (as the job's output channels send them), then the rest."""
    partitioner = HashPartitioner(identity, P, MAX_PARALLELISM)
    pending: list[list[str]] = [[] for _ in range(P)]
    for first in range(index, n, P * batch):
        records = [word(i) for i in range(first, min(n, first + P * batch), P)]
        for target, part in partitioner.partition(records):
            bucket = pending[target]
            bucket.extend(part)
            while len(bucket) >= batch:  # exactly ``batch`` per frame, the rest waits
                yield target, bucket[:batch]
                del bucket[:batch]
    for target, bucket in enumerate(pending):
        if bucket:
            yield target, bucket


def four_source(
    index: int, n: int, batch: int, directory: str, out: Any, go: Any, done: Any
) -> None:
    with task_scheduling("batch"):
        ctx: zmq.Context[Any] = zmq.Context()
        pushes = [push_socket(ctx, directory, target) for target in range(P)]
        out.put(("ready", index))
        go.wait(WAIT)
        for target, records in frames_of(index, n, batch):
            pushes[target].send(encode_data(0, records))
        for push in pushes:
            push.send(END)
        done.wait(WAIT)  # every frame counted: closing now loses nothing
        ctx.destroy(linger=0)


def four_counter(index: int, directory: str, out: Any) -> None:
    with task_scheduling("batch"):
        ctx: zmq.Context[Any] = zmq.Context()
        gate = gate_socket(ctx, directory, index)
        out.put(("ready", index))
        counter, ended = Counter(), 0
        while ended < P:
            if not gate.poll(int(WAIT * 1000)):
                raise SystemExit(f"counter {index}: no frame for {WAIT} s")
            ended += counter.take(gate.recv())
        out.put(("counted", index, time.perf_counter(), counter.seen, sum(counter.last.values())))
        ctx.destroy(linger=0)


def colocated_worker(
    index: int, n: int, batch: int, directory: str, out: Any, go: Any, done: Any
) -> None:
    with task_scheduling("batch"):
        ctx: zmq.Context[Any] = zmq.Context()
        gate = gate_socket(ctx, directory, index)
        push = push_socket(ctx, directory, 1 - index)
        poller = zmq.Poller()
        poller.register(gate, zmq.POLLIN)
        poller.register(push, zmq.POLLOUT)
        counter, ended = Counter(), 0

        def drain() -> None:
            nonlocal ended
            while gate.poll(0):
                ended += counter.take(gate.recv())

        def send(frame: bytes) -> None:
            while True:
                try:
                    push.send(frame, zmq.NOBLOCK)
                    return
                except zmq.Again:  # the other's gate is full: count what came meanwhile
                    poller.poll(10)
                    drain()

        out.put(("ready", index))
        go.wait(WAIT)
        for target, records in frames_of(index, n, batch):
            if target == index:
                counter.count(records)
            else:
                send(encode_data(0, records))
                drain()
        send(END)
        deadline = time.monotonic() + WAIT
        while not ended:
            if time.monotonic() > deadline:
                raise SystemExit(f"co-located {index}: the other's end never came")
            poller.poll(50)
            drain()
        out.put(("counted", index, time.perf_counter(), counter.seen, sum(counter.last.values())))
        done.wait(WAIT)  # the other has counted everything this process sent
        ctx.destroy(linger=0)


def bare_rate(layout: str, n: int, batch: int, start: str = "spawn") -> float:
    """Records/s of one run of a bare layout ("four" or "co-located"), from the sources'
    start to the last record counted (checked). ``start``: how its processes start
    (a `multiprocessing` start method)."""
    mpc: Any = mp.get_context(start)
    with tempfile.TemporaryDirectory(prefix="absflow-bound-") as directory:
        out, go, done = mpc.Queue(), mpc.Event(), mpc.Event()
        if layout == "four":
            counters = [
                mpc.Process(target=four_counter, args=(i, directory, out)) for i in range(P)
            ]
            senders = [
                mpc.Process(target=four_source, args=(i, n, batch, directory, out, go, done))
                for i in range(P)
            ]
        else:
            counters = []
            senders = [
                mpc.Process(target=colocated_worker, args=(i, n, batch, directory, out, go, done))
                for i in range(P)
            ]
        procs = counters + senders
        try:
            for proc in procs:
                proc.start()
            for _ in procs:  # every process started, its sockets set up
                out.get(timeout=WAIT)
            started = time.perf_counter()
            go.set()
            results = [out.get(timeout=WAIT) for _ in range(P)]
            done.set()
            for proc in procs:
                proc.join(60)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                    proc.join()
    counted = [r for r in results if r[0] == "counted"]
    seconds: float = max(r[2] for r in counted) - started
    if sum(r[3] for r in counted) != n or sum(r[4] for r in counted) != n:
        raise SystemExit(f"{layout}: wrong result {counted}")
    return n / seconds


def job_rate(n: int, batch: int) -> float:
    """Records/s of the keyed count at p = 2 on the local launcher, over its processing
    time (first record -> all output committed)."""
    result = build(n, P, progress=False, ui=False, launcher="local", batch_size=batch).run()
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"the job (batch {batch}): wrong result {got}")
    processing: float = result.duration - (result.startup_seconds or 0.0)
    return n / processing


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--batch", type=int, nargs="+", default=[1000], help="records per frame (one run each)"
    )
    ap.add_argument("--skip-job", action="store_true", help="only the bare layouts")
    ap.add_argument(
        "--start",
        choices=("spawn", "fork"),
        default="spawn",
        help="how the bare layouts' processes start (spawn: fresh interpreters, as the "
        "job's tasks; fork: copies of this process, sharing its imported code)",
    )
    args = ap.parse_args()
    n: int = args.n
    runs: dict[str, Callable[[], float]] = {"floor": functools.partial(plain_python, n)}
    for b in args.batch:
        runs[f"four processes, {b}"] = functools.partial(bare_rate, "four", n, b, args.start)
        runs[f"co-located, {b}"] = functools.partial(bare_rate, "co-located", n, b, args.start)
        if not args.skip_job:
            runs[f"the job (local), {b}"] = functools.partial(job_rate, n, b)
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    ratios: dict[str, list[float]] = {name: [] for name in names[1:]}
    for rnd in range(args.repeat):
        k = rnd % len(names)
        got = {}
        for name in names[k:] + names[:k]:  # each run goes first in some round
            got[name] = runs[name]()
            rates[name].append(got[name])
        for name in names[1:]:
            ratios[name].append(got[name] / got["floor"])
        print(
            f"  round {rnd + 1}/{args.repeat}: "
            + ", ".join(f"{name} {got[name] / 1e6:.2f} M" for name in names),
            flush=True,
        )

    def spread(xs: list[float], fmt: str) -> str:
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"

    print(
        f"\n== keyed count at p = 2, N = {args.n:,}: records/s and / floor per round, "
        f"median [min-max] of {args.repeat} =="
    )
    print(f"{'layout, records per frame':<28} {'records/s':>22}   / floor")
    for name in names:
        ratio = spread(ratios[name], ".2f") if name in ratios else ""
        print(f"{name:<28} {spread([x / 1e6 for x in rates[name]], '.2f'):>20} M   {ratio}")


if __name__ == "__main__":
    main()
