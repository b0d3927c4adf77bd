"""What co-locating a source subtask with a keyed subtask could give the keyed count at
p = 2, at best: the bound for Flink-style slot sharing on this machine.

    python benchmarks/colocation_bound.py [--n 20000000] [--repeat 5]

Today p = 2 runs four task processes on two cores (two sources, two counting tasks).
Co-located, it would run two: process i generates records i, i + 2, ... (the keyed
count's records), partitions them by key with absflow's `HashPartitioner`, counts its own
key half in place (the running count and the sink's bookkeeping, as the job does) and
sends the other half, msgpack-framed by `channels.messages`, over ZeroMQ (Unix sockets,
the job's high-water mark) to the other process, whose half it counts as it arrives. No
checkpoints, control plane or metrics: only the per-record work a co-located job could not
avoid. Printed beside the plain-Python floor (`../shared/peers/python_baseline.py`),
interleaved rounds, median [min-max]; each round checks sum(last counts) == N.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import zmq

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import word
from throughput import plain_python

from channels.messages import decode_records, encode_data
from channels.partitioners import HashPartitioner
from runtime.config import JobConfig

P, BATCH, MAX_PARALLELISM = 2, 1000, 128
END = b"end"


def identity(w: str) -> str:
    return w


def worker(index: int, n: int, directory: str, out: Any) -> None:
    ctx: zmq.Context[Any] = zmq.Context()
    hwm = JobConfig().channel_hwm
    gate = ctx.socket(zmq.PULL)
    gate.setsockopt(zmq.RCVHWM, hwm)
    gate.bind(f"ipc://{directory}/{index}")
    other = 1 - index
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, hwm)
    push.connect(f"ipc://{directory}/{other}")
    poller = zmq.Poller()
    poller.register(gate, zmq.POLLIN)
    poller.register(push, zmq.POLLOUT)
    partitioner = HashPartitioner(identity, P, MAX_PARALLELISM)
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    seen = ended = 0

    def count(records: list[Any]) -> None:
        nonlocal seen
        get = counts.get
        emitted: list[tuple[str, int]] = []
        append = emitted.append
        for r in records:  # the running count (AggregateOperator's fast path)
            c = get(r, 0) + 1
            counts[r] = c
            append((r, c))
        seen += len(emitted)
        for k, c in emitted:  # the sink (CountingSink.write_batch)
            last[k] = c

    def drain() -> None:
        nonlocal ended
        while gate.poll(0):
            frame = gate.recv()
            if frame == END:
                ended += 1
            else:
                count(decode_records(frame))

    def send(frame: bytes) -> None:
        while True:
            try:
                push.send(frame, zmq.NOBLOCK)
                return
            except zmq.Again:  # the other's gate is full: count what came meanwhile
                poller.poll(10)
                drain()

    out.put(("ready", index))
    started = time.perf_counter()
    for first in range(index, n, P * BATCH):
        batch = [word(i) for i in range(first, min(n, first + P * BATCH), P)]
        for target, part in partitioner.partition(batch):
            if target == index:
                count(part)
            else:
                send(encode_data(0, part))
        drain()
    send(END)
    while not ended:
        poller.poll(50)
        drain()
    out.put((index, time.perf_counter() - started, seen, sum(last.values())))
    ctx.destroy(linger=0)


def colocated_rate(n: int) -> float:
    """Records/s of one run of the two co-located processes (checked)."""
    fork = mp.get_context("fork")
    with tempfile.TemporaryDirectory(prefix="absflow-coloc-") as directory:
        out = fork.Queue()
        procs = [fork.Process(target=worker, args=(i, n, directory, out)) for i in range(P)]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=600) for _ in range(2 * P)]
        for proc in procs:
            proc.join(60)
    runs = [r for r in results if r[0] != "ready"]
    seconds = float(max(r[1] for r in runs))
    if sum(r[2] for r in runs) != n or sum(r[3] for r in runs) != n:
        raise SystemExit(f"wrong result: {runs}")
    return n / seconds


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=20_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rates: dict[str, list[float]] = {"co-located p = 2": [], "floor": []}
    ratios = []
    for rnd in range(args.repeat):
        order = ["co-located p = 2", "floor"] if rnd % 2 == 0 else ["floor", "co-located p = 2"]
        got = {}
        for name in order:
            got[name] = colocated_rate(args.n) if name != "floor" else plain_python(args.n)
            rates[name].append(got[name])
        ratios.append(got["co-located p = 2"] / got["floor"])
        print(
            f"  round {rnd + 1}/{args.repeat}: "
            + ", ".join(f"{k} {v:,.0f}" for k, v in got.items())
        )

    def spread(xs: list[float], fmt: str) -> str:
        return f"{statistics.median(xs):{fmt}} [{min(xs):{fmt}}-{max(xs):{fmt}}]"

    print(f"\n== keyed count, N = {args.n:,}, records/s, median [min-max] of {args.repeat} ==")
    for name, xs in rates.items():
        print(f"{name:<20} {spread([x / 1e6 for x in xs], '.2f')} M")
    print(f"co-located p = 2 / floor, per round = {spread(ratios, '.2f')}")


if __name__ == "__main__":
    main()
