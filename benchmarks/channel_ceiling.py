"""Benchmark (a): the raw ceiling of one channel, producer process -> consumer process.

The producer (this process) writes ``n`` string records through an
``OutputChannel``; the consumer (a spawned process) owns an ``InputGate`` on
127.0.0.1, decodes every batch and counts records until ``EndOfInput``. The
clock runs from the first write until the consumer reports the end, so the
figure includes encoding, transport and decoding, nothing else.

Two producer variants: ``generated`` formats every record inside the timed
loop, as a source would; ``pregenerated`` writes ready-made batches (the
transport and codec alone).

Run: ``python benchmarks/channel_ceiling.py [n]``.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import zmq

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from channels.messages import (
    KIND_DATA,
    KIND_END_OF_INPUT,
    EndOfInput,
    decode_header,
    decode_records,
)
from channels.zmq_io import InputGate, OutputChannel

HOST = "127.0.0.1"
DISTINCT_WORDS = 10_000
CONSUMER_TIMEOUT_S = 120.0


def _consume(conn: Connection) -> None:
    """Consumer process: count decoded records until EndOfInput, report back."""
    context: zmq.Context[Any] = zmq.Context()
    gate = InputGate(context, HOST)
    try:
        conn.send(gate.endpoint)
        records = 0
        frames_bytes = 0
        socket = gate.socket
        deadline = time.monotonic() + CONSUMER_TIMEOUT_S
        done = False
        while not done:
            if not socket.poll(100, zmq.POLLIN):
                if time.monotonic() > deadline:
                    raise TimeoutError("producer sent no EndOfInput")
                continue
            for frame in gate.recv_frames(256):
                frames_bytes += len(frame)
                _, kind = decode_header(frame)
                if kind == KIND_DATA:
                    records += len(decode_records(frame))
                elif kind == KIND_END_OF_INPUT:
                    done = True
        conn.send((records, frames_bytes))
    finally:
        gate.close()
        context.term()


def _produce_generated(out: OutputChannel, n: int, batch_size: int) -> None:
    for base in range(0, n, batch_size):
        out.write(
            [f"w{(i * 7919) % DISTINCT_WORDS}" for i in range(base, min(base + batch_size, n))]
        )


def _pregenerate(n: int, batch_size: int) -> list[list[str]]:
    pool = [f"w{j}" for j in range(DISTINCT_WORDS)]
    return [
        [pool[(i * 7919) % DISTINCT_WORDS] for i in range(base, min(base + batch_size, n))]
        for base in range(0, n, batch_size)
    ]


def measure_channel_ceiling(
    n: int = 2_000_000, batch_size: int = 1000, pregenerated: bool = False
) -> dict[str, Any]:
    """Push ``n`` records through one channel into another process; return the rates.

    Returns a dict with ``records``, ``batch_size``, ``variant``, ``seconds``,
    ``records_per_s``, ``bytes_per_s`` (frame bytes, header included) and
    ``bytes_per_record``.
    """
    batches = _pregenerate(n, batch_size) if pregenerated else None
    ctx = mp.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    consumer = ctx.Process(target=_consume, args=(child_conn,), daemon=True)
    consumer.start()
    context: zmq.Context[Any] = zmq.Context()
    out: OutputChannel | None = None
    try:
        if not parent_conn.poll(30):
            raise TimeoutError("consumer process did not start")
        endpoint: str = parent_conn.recv()
        out = OutputChannel(context, endpoint, channel_id=0, batch_size=batch_size)
        start = time.perf_counter()
        if batches is None:
            _produce_generated(out, n, batch_size)
        else:
            for batch in batches:
                out.write(batch)
        out.send_event(EndOfInput())
        if not parent_conn.poll(CONSUMER_TIMEOUT_S):
            raise TimeoutError("consumer did not report the end of input")
        received, frame_bytes = parent_conn.recv()
        seconds = time.perf_counter() - start
    finally:
        if out is not None:
            out.close()
        context.term()
        consumer.join(10)
        if consumer.is_alive():
            consumer.terminate()
            consumer.join()
    if received != n:
        raise AssertionError(f"consumer counted {received} records, producer sent {n}")
    return {
        "records": n,
        "batch_size": batch_size,
        "variant": "pregenerated" if pregenerated else "generated",
        "seconds": seconds,
        "records_per_s": n / seconds,
        "bytes_per_s": frame_bytes / seconds,
        "bytes_per_record": frame_bytes / n,
    }


def main(argv: list[str]) -> None:
    n = int(argv[1]) if len(argv) > 1 else 2_000_000
    repeats = int(argv[2]) if len(argv) > 2 else 2
    print(f"{'variant':<13} {'batch':>6} {'records/s':>12} {'MB/s':>8} {'B/rec':>6}")
    for pregenerated in (False, True):
        for batch_size in (500, 1000, 2000, 5000):
            best = max(
                (measure_channel_ceiling(n, batch_size, pregenerated) for _ in range(repeats)),
                key=lambda result: float(result["records_per_s"]),
            )
            print(
                f"{best['variant']:<13} {batch_size:>6} {best['records_per_s']:>12,.0f} "
                f"{best['bytes_per_s'] / 1e6:>8.1f} {best['bytes_per_record']:>6.2f}"
            )


if __name__ == "__main__":
    main(sys.argv)
