"""What lz4 on task state files costs and saves: ``JobConfig.snapshot_compression``.

    python benchmarks/snapshot_compression.py [--runs 8] [--words 4000000] [--mb 10]

Two parts, each printing both settings side by side:

1. **The writer thread's work**, in this process, on a state like the main example's: a
   collect sink's pre-committed epoch (``--mb`` MB of msgpack ``(word, count)`` records)
   written as a task state file by ``CheckpointStorage.write_task_state`` (encode, write,
   fsync) to a temp dir: file size, CPU ms and wall ms (median of 7, idle machine).
2. **The main example's checkpoints** (``examples/wordcount.py``: 4,000,000 words,
   parallelism 2, a checkpoint every 0.5 s, embedded local Spark), ``--runs`` runs of
   each setting, interleaved (raw, lz4, lz4, raw, ...), every result checked against
   collections.Counter: pooled checkpoint duration p50 / p99 and write p50 per setting,
   and the median over rounds of the ratio of each round's median durations (lz4 / raw).

On a loaded machine the writer thread's CPU is taken from the task processes, so part 2
is the figure that matters; part 1 says where the difference comes from.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import msgpack

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from wordcount_checkpoints import Corpus, describe, summary

from statebackend import CheckpointStorage, OperatorLayout, OperatorSnapshot

SETTINGS = {"raw": False, "lz4": True}


def epoch_state(mb: float) -> dict[str, OperatorSnapshot]:
    """A collect sink's pre-commit of about ``mb`` MB: (word, running count) records."""
    words = [f"{a}{b}{c}" for a in ("ka", "lo", "mi", "ra") for b in "aeiou" for c in "nrst"]
    records, size, i = [], 0, 0
    while size < mb * 1e6:
        batch = [(words[(i + j) % len(words)], i + j) for j in range(10_000)]
        records += batch
        size += len(msgpack.packb(batch))
        i += 10_000
    blob = msgpack.packb({"pending": [[1, msgpack.packb(records)]], "checkpoint": 1, "next": 2})
    return {"counts": OperatorSnapshot(blob, None, None)}


def writer_work(mb: float, repeat: int = 7) -> None:
    snapshots = epoch_state(mb)
    layout = {"counts": OperatorLayout(0, 2)}
    raw = len(snapshots["counts"].operator_state or b"")
    print(f"== the writer thread's work: a {raw / 1e6:.1f} MB sink epoch, median of {repeat} ==")
    with tempfile.TemporaryDirectory(prefix="absflow-compression-") as root:
        for name, compress in SETTINGS.items():
            storage = CheckpointStorage(root, compression=compress)
            cpu, wall, size = [], [], 0
            for n in range(repeat):
                c0, w0 = time.thread_time(), time.perf_counter()
                size = storage.write_task_state(n + 1, name, snapshots, layout).size
                cpu.append((time.thread_time() - c0) * 1e3)
                wall.append((time.perf_counter() - w0) * 1e3)
            print(
                f"{name:4s} file {size / 1e6:5.1f} MB   CPU {statistics.median(cpu):6.1f} ms   "
                f"wall {statistics.median(wall):6.1f} ms"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=8, help="runs of the example per setting")
    ap.add_argument("--words", type=int, default=4_000_000)
    ap.add_argument("--mb", type=float, default=10.0, help="state size in part 1")
    ap.add_argument(
        "--data", default=os.path.join(tempfile.gettempdir(), "absflow-bench-wordcount")
    )
    args = ap.parse_args()
    writer_work(args.mb)
    corpus = Corpus(args.data, args.words)
    pooled: dict[str, list[dict[str, float]]] = {name: [] for name in SETTINGS}
    ratios = []
    print(f"\n== examples/wordcount.py, {args.runs} runs per setting, interleaved ==")
    for i in range(args.runs):
        medians = {}
        for name in list(SETTINGS)[:: 1 if i % 2 == 0 else -1]:
            duration, checkpoints = corpus.run(
                {"snapshot_compression": SETTINGS[name]}, f"{name} run {i}"
            )
            pooled[name] += checkpoints
            medians[name] = statistics.median(c["duration_ms"] for c in checkpoints)
            print(f"round {i} {name}: {duration:.2f} s, checkpoints ms: {describe(checkpoints)}")
        ratios.append(medians["lz4"] / medians["raw"])
    print()
    for name, checkpoints in pooled.items():
        print(f"{name:4s} {len(checkpoints)} checkpoints: {summary(checkpoints)}")
    print(
        f"lz4 / raw, median checkpoint duration per round: {statistics.median(ratios):.2f} "
        f"[{min(ratios):.2f}-{max(ratios):.2f}]"
    )


if __name__ == "__main__":
    main()
