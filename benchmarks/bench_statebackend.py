"""Synchronous vs asynchronous snapshot cost of keyed state (a snapshot reports both parts:
docs/checkpoints.md).

    python benchmarks/bench_statebackend.py [num_keys ...]

Synchronous part: ``KeyedStateBackend.snapshot()`` (task blocked). Asynchronous part:
``write_task_snapshot`` (split per key group, lz4, write, fsync, rename) in a thread.
"""

import os
import sys
import tempfile
import time
import zlib
from typing import Any

import msgpack

from statebackend import (
    KeyedStateBackend,
    OperatorSnapshot,
    SpillBuffer,
    read_keyed_state,
    write_task_snapshot,
)

MAX_PARALLELISM = 128


def key_group_of(key: Any) -> int:
    return zlib.crc32(msgpack.packb(key, use_bin_type=True)) % MAX_PARALLELISM


def best_of(n: int, fn: Any) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench(num_keys: int, directory: str) -> None:
    backend = KeyedStateBackend("count", MAX_PARALLELISM, range(MAX_PARALLELISM), key_group_of)
    values = backend.value_state()
    for i in range(num_keys):
        values[i] = i * 31
    sync = best_of(20, backend.snapshot)
    blob = backend.snapshot()
    path = os.path.join(directory, "count[0].state")
    snaps = {"count": OperatorSnapshot(None, blob, range(MAX_PARALLELISM))}
    fns = {"count": key_group_of}
    split = best_of(5, lambda: KeyedStateBackend.split_by_key_group(blob, key_group_of))
    write = best_of(5, lambda: write_task_snapshot(path, snaps, fns))
    size = os.path.getsize(path)

    def restore() -> None:
        KeyedStateBackend("count", MAX_PARALLELISM, range(MAX_PARALLELISM), key_group_of).restore(
            read_keyed_state(path, "count", range(MAX_PARALLELISM))
        )

    rest = best_of(5, restore)
    print(
        f"{num_keys:>9,} int keys: snapshot() {sync * 1e3:7.2f} ms ({len(blob):,} B) | "
        f"split {split * 1e3:7.1f} ms | write_task_snapshot {write * 1e3:7.1f} ms "
        f"({size:,} B on disk) | read+restore {rest * 1e3:7.1f} ms"
    )


def bench_spill(directory: str) -> None:
    frame = os.urandom(32 * 1024)
    n = 2000  # 64 MiB through the file
    buf = SpillBuffer(directory, memory_threshold=0)
    start = time.perf_counter()
    for _ in range(n):
        buf.append(frame)
    mid = time.perf_counter()
    while buf:
        buf.popleft()
    end = time.perf_counter()
    mib = n * len(frame) / 2**20
    print(
        f"spill of {mib:.0f} MiB in 32 KiB frames: append {mib / (mid - start):.0f} MiB/s, "
        f"popleft {mib / (end - mid):.0f} MiB/s"
    )
    buf.close()


if __name__ == "__main__":
    sizes = [int(a) for a in sys.argv[1:]] or [10_000, 100_000, 1_000_000]
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            bench(n, tmp)
        bench_spill(tmp)
