"""HashPartitioner throughput: 10,000 distinct string keys, batches of 1,000.

``warm`` is the steady state (every key cached: one dict lookup per record);
``uncached`` uses a fresh partitioner per batch, so every distinct key of the
batch is hashed (crc32 of msgpack) once: the cost of a high-cardinality stream.

Run: ``python benchmarks/partitioner_hash.py``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the repo importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from channels.partitioners import DEFAULT_MAX_PARALLELISM, HashPartitioner

DISTINCT_KEYS = 10_000


def _batches(n: int, batch_size: int) -> list[list[str]]:
    words = [f"w{(i * 7919) % DISTINCT_KEYS}" for i in range(n)]
    return [words[i : i + batch_size] for i in range(0, n, batch_size)]


def measure_hash_partitioner(
    num_targets: int = 4, n: int = 1_000_000, batch_size: int = 1000, warm: bool = True
) -> dict[str, Any]:
    """Records per second of ``HashPartitioner.partition`` with ``key_fn=lambda w: w``."""
    batches = _batches(n, batch_size)
    partitioner = HashPartitioner(lambda w: w, num_targets, DEFAULT_MAX_PARALLELISM)
    if warm:
        for batch in batches[: 2 * DISTINCT_KEYS // batch_size]:
            partitioner.partition(batch)
    start = time.perf_counter()
    if warm:
        for batch in batches:
            partitioner.partition(batch)
    else:
        for batch in batches:
            HashPartitioner(lambda w: w, num_targets, DEFAULT_MAX_PARALLELISM).partition(batch)
    seconds = time.perf_counter() - start
    return {"num_targets": num_targets, "warm": warm, "records_per_s": n / seconds}


def main() -> None:
    print(f"{'targets':>7} {'cache':>8} {'records/s':>12}")
    for warm in (True, False):
        for num_targets in (2, 4, 8, 32):
            best = max(
                measure_hash_partitioner(num_targets, warm=warm)["records_per_s"] for _ in range(3)
            )
            print(f"{num_targets:>7} {'warm' if warm else 'uncached':>8} {best:>12,.0f}")


if __name__ == "__main__":
    main()
