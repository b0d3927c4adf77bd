"""Where each microsecond per record goes on the keyed count's hot path, stage by stage.

    python benchmarks/hot_path.py [--n 1000000] [--batch 1000] [--repeat 5]

Runs the runtime's own pieces of the keyed count (benchmarks/keyed_count.py) in this
one process, batch by batch, as the task processes run them at parallelism 2: the
source reader (``GeneratorSource``), the hash partitioner of ``key_by`` (2 targets),
the data-frame codec (encode, decode: a batch of words goes as a text frame), the
aggregate operator (the running count) and the sink operator
(``CountingSink.write_batch``). Prints µs per record per stage (best of ``--repeat``:
the figure least disturbed by other load on the machine; the partitioner and the
aggregate take each batch as the source reader or the decoder has just made it, fresh
strings whose hashes are not cached yet, still in the caches), their sum, and the
plain-Python loop of ../shared/peers/python_baseline.py for scale. No ZeroMQ, no
process switches: those are what the end-to-end benchmarks/throughput.py adds on top.
Writes benchmarks/results/hot_path.json (``python benchmarks/render.py`` shows it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from keyed_count import VOCAB, CountingSink, build
from results import write_result

from channels.messages import decode_records, encode_data
from channels.partitioners import HashPartitioner
from runtime.graph import StepKind
from runtime.operators import build_operator
from runtime.sinks import SinkContext


def plain_python_us(n: int) -> float:
    t0 = time.process_time()
    counts: dict[str, int] = {}
    last: dict[str, int] = {}
    sink_n = 0
    for i in range(n):
        w = f"w{(i * 7919) % VOCAB}"
        c = counts.get(w, 0) + 1
        counts[w] = c
        sink_n += 1
        last[w] = c
    us = (time.process_time() - t0) / n * 1e6
    assert sum(last.values()) == n and sink_n == n
    return us


def best_us(fn: Callable[[], int], repeat: int, setup: Callable[[], None] | None = None) -> float:
    """Best of ``repeat`` runs of ``fn`` (which returns its record count), µs per record;
    ``setup`` (untimed) runs before each."""
    best = float("inf")
    for _ in range(repeat):
        if setup is not None:
            setup()
        t0 = time.process_time()
        n = fn()
        best = min(best, (time.process_time() - t0) / n * 1e6)
    return best


def best_each_us(
    inputs: Callable[[], Iterator[list[Any]]], fn: Callable[[list[Any]], Any], repeat: int
) -> float:
    """Best of ``repeat`` runs of ``fn`` on each batch ``inputs()`` yields, µs per record,
    timing ``fn`` only: each batch is made (untimed) right before ``fn`` takes it, with
    its records still in the caches, as a task makes and passes on one batch at a time."""
    best = float("inf")
    for _ in range(repeat):
        spent, n = 0.0, 0
        for batch in inputs():
            t0 = time.perf_counter()
            fn(batch)
            spent += time.perf_counter() - t0
            n += len(batch)
        best = min(best, spent / n * 1e6)
    return best


def batches_of(source: Any, batch_size: int) -> Iterator[list[Any]]:
    """Every batch of subtask 0 of 1 of ``source``, as it is read: new record objects
    each call."""
    reader = source.create_reader(0, 1)
    while (b := reader.read_batch(batch_size)) is not None:
        yield b


def stages(n: int, batch_size: int, repeat: int) -> dict[str, float]:
    flow = build(n, 2, progress=False)
    plan = flow.plan()
    source = next(s for s in plan.steps if s.kind is StepKind.SOURCE)
    agg = next(s for s in plan.steps if s.kind is StepKind.AGGREGATE)
    sink_step = next(s for s in plan.steps if s.kind is StepKind.SINK)
    key_fn = agg.key_fn
    assert key_fn is not None

    # Inputs of each stage, made by the stage before it. The partitioner and the
    # aggregate take fresh strings, each batch as it is made (best_each_us), as in a task:
    # a str caches its hash, and reused records would leave out the hashing both stages
    # do on every record.
    batches = list(batches_of(source.fn, batch_size))
    # the partitioner's key cache is warm at steady state
    warm = next(batches_of(source.fn, batch_size))
    partitioner = HashPartitioner(key_fn, 2, plan.max_parallelism)
    parts = [part for b in batches for _, part in partitioner.partition(b)]
    frames = [encode_data(0, part) for part in parts]
    decoded = [decode_records(f) for f in frames]

    def gen() -> int:
        return sum(len(b) for b in batches_of(source.fn, batch_size))

    def encode() -> int:
        for part in parts:
            encode_data(0, part)
        return n

    def decode() -> int:
        for f in frames:
            decode_records(f)
        return n

    def decoded_batches() -> Iterator[list[Any]]:
        return (decode_records(f) for f in frames)

    partitioner = HashPartitioner(key_fn, 2, plan.max_parallelism)
    partitioner.partition(warm)
    aggregate = build_operator(agg, 0, plan.max_parallelism)

    out_batches = []
    op = build_operator(agg, 0, plan.max_parallelism)
    out_batches = [op.process(b) for b in decoded]

    def sink() -> int:
        s = CountingSink()
        ctx = SinkContext(sink_step.name, 0, 1, 0, lambda _c, _r: None)
        s.open(ctx)
        for b in out_batches:
            s.write_batch(b)
        return n

    return {
        "source: generate (GeneratorSource.read_batch)": best_us(gen, repeat),
        "key_by: partition (HashPartitioner, 2 targets)": best_each_us(
            lambda: batches_of(source.fn, batch_size), partitioner.partition, repeat
        ),
        "encode (text frame)": best_us(encode, repeat),
        "decode (text frame)": best_us(decode, repeat),
        "aggregate operator (running count)": best_each_us(
            decoded_batches, aggregate.process, repeat
        ),
        "sink (CountingSink.write_batch)": best_us(sink, repeat),
    }


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    figures = stages(args.n, args.batch, args.repeat)
    floor = min(plain_python_us(args.n) for _ in range(args.repeat))
    width = max(map(len, figures))
    print(f"== hot path, µs per record (best of {args.repeat}, N = {args.n:,}) ==")
    for name, us in figures.items():
        print(f"{name:<{width}}  {us:6.3f}")
    total = sum(figures.values())
    print(f"{'sum of the stages':<{width}}  {total:6.3f}")
    print(f"{'plain Python loop, one process (the floor)':<{width}}  {floor:6.3f}")
    print(f"sum / floor = {total / floor:.2f} (parallelism 2 has two cores for the sum)")
    result = {
        "records": args.n,
        "batch": args.batch,
        "stages_us": [[name, round(us, 4)] for name, us in figures.items()],  # in order
        "floor_us": round(floor, 4),
    }
    print(f"wrote {write_result('hot_path', result, rounds=args.repeat)}")


if __name__ == "__main__":
    main()
