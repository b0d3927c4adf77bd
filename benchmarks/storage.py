"""Checkpoint duration with checkpoints on local disk and on S3 (moto on loopback).

    python benchmarks/storage.py [--n 2000000] [--interval 0.2] [--repeat 5]

The keyed running count of the throughput benchmark (N records, 10,000 keys,
parallelism 2), checkpointed every --interval seconds, once with checkpoint_dir on
local disk and once on s3:// (moto's S3 server on 127.0.0.1, a free port), interleaved, --repeat rounds. Prints per storage, over every regular (not
final) checkpoint of all rounds: checkpoint duration p50 / p99 (trigger -> _metadata
written), the slowest task's state write (max_async_ms) p50 / p99, the state size,
and the median processing time. moto runs in a process of its own; it is a Python
server on loopback: no network latency, but slower per request than S3, and on the
same cores as the job. Compare the two side by side, not with a real bucket.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from checkpoint_overhead import percentile
from keyed_count import build, check

BUCKET = "absflow-bench"
CREDENTIALS = {"key": "bench", "secret": "bench"}


def _serve_s3(conn: Any) -> None:
    """In a child process: moto's server on a free loopback port (the OS picks it),
    its port sent back through ``conn``, until ``conn`` says stop."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    conn.send(server.get_host_and_port())
    conn.recv()
    server.stop()


def start_s3() -> tuple[Callable[[], None], dict[str, Any]]:
    """moto's S3 in its own process (like S3, not sharing the driver's interpreter) with
    one bucket; returns a function that stops it, and the storage_options."""
    import boto3

    parent, child = multiprocessing.Pipe()
    process = multiprocessing.get_context("spawn").Process(target=_serve_s3, args=(child,))
    process.start()
    host, port = parent.recv()
    endpoint = f"http://{host}:{port}"
    boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=CREDENTIALS["key"],
        aws_secret_access_key=CREDENTIALS["secret"],
        region_name="us-east-1",
    ).create_bucket(Bucket=BUCKET)
    options = {
        **CREDENTIALS,
        "endpoint_url": endpoint,
        "client_kwargs": {"region_name": "us-east-1"},
    }

    def stop() -> None:
        parent.send("stop")
        process.join(10)

    return stop, options


def run(n: int, interval: float, checkpoint_dir: str, options: dict[str, Any]) -> Any:
    result = build(
        n,
        2,
        progress=False,
        checkpoint_interval=interval,
        checkpoint_dir=checkpoint_dir,
        storage_options=options,
    ).run()
    got = check(result, n)
    if not got["correct"]:
        raise SystemExit(f"{checkpoint_dir}: wrong result {got}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=2_000_000)
    ap.add_argument("--interval", type=float, default=0.2)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n, interval = args.n, args.interval

    stop_s3, s3_options = start_s3()
    local_root = tempfile.mkdtemp(prefix="storage-bench-")
    storages: dict[str, tuple[str, dict[str, Any]]] = {
        "local disk": (local_root, {}),
        "S3 (moto)": (f"s3://{BUCKET}", s3_options),
    }
    durations: dict[str, list[float]] = {s: [] for s in storages}
    writes: dict[str, list[float]] = {s: [] for s in storages}
    state: dict[str, list[int]] = {s: [] for s in storages}
    times: dict[str, list[float]] = {s: [] for s in storages}
    try:
        print(f"warming up ... (N = {n:,}, parallelism 2, interval {interval} s)", flush=True)
        for root, options in storages.values():
            run(10_000, interval, f"{root}/warm-up", options)
        for rep in range(args.repeat):
            for name, (root, options) in storages.items():
                r = run(n, interval, f"{root}/round-{rep}", options)
                regular = [c.encode() for c in r.checkpoints if not c.final]
                durations[name] += [c["duration_ms"] for c in regular]
                writes[name] += [c["max_async_ms"] for c in regular]
                state[name] += [c["state_bytes"] for c in regular]
                times[name].append(r.duration - (r.startup_seconds or 0.0))
            print(
                f"  round {rep + 1}/{args.repeat}: "
                + ", ".join(f"{s} {times[s][-1]:.2f} s" for s in storages),
                flush=True,
            )
    finally:
        stop_s3()
        shutil.rmtree(local_root, ignore_errors=True)

    print(
        f"\n== checkpoints of the keyed running count, {n:,} records, parallelism 2, "
        f"every {interval} s, {args.repeat} rounds =="
    )
    print(
        f"{'storage':>11} {'chks':>5} {'duration p50':>13} {'p99':>7} "
        f"{'write p50':>10} {'p99':>7} {'state KiB':>10} {'run s':>6}"
    )
    for name in storages:
        d, w = durations[name], writes[name]
        kib = statistics.median(state[name]) / 1024 if state[name] else 0.0
        print(
            f"{name:>11} {len(d):>5} {percentile(d, 50):>10.1f} ms {percentile(d, 99):>7.1f} "
            f"{percentile(w, 50):>7.1f} ms {percentile(w, 99):>7.1f} {kib:>10.0f} "
            f"{statistics.median(times[name]):>6.2f}"
        )


if __name__ == "__main__":
    main()
