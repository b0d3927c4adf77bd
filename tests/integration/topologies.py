"""Pipelines shared by the integration and fault-injection tests, with their expected output."""

from __future__ import annotations

import collections
import random
import time
from typing import Any

from runtime import Dataflow
from runtime.sources import GeneratorSource, Source, SourceReader, TextFileSource
from statebackend.storage import CheckpointStorage


def write_corpus(directory: str, words: int, files: int = 3, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(500)]
    paths = []
    for f in range(files):
        path = f"{directory}/part-{f}.txt"
        chosen = rng.choices(
            vocab, weights=[1 / (i + 1) for i in range(len(vocab))], k=words // files
        )
        with open(path, "w") as fh:
            fh.write(
                "\n".join(" ".join(chosen[j : j + 9]) for j in range(0, len(chosen), 9)) + "\n"
            )
        paths.append(path)
    return paths


def corpus_counts(paths: list[str]) -> dict[str, int]:
    c: collections.Counter[str] = collections.Counter()
    for p in paths:
        with open(p) as fh:
            for line in fh:
                c.update(line.split())
    return dict(c)


def wordcount(paths: list[str], parallelism: int = 2, **config: Any) -> Dataflow:
    flow = Dataflow("wordcount", parallelism=parallelism, **config)
    (
        flow.source(TextFileSource(paths), name="lines")
        .flat_map(str.split, name="split")
        .key_by(lambda w: w)
        .aggregate(0, lambda c, _w: c + 1, name="count")
        .collect("counts")
    )
    return flow


def running_counts(counts: dict[str, int]) -> collections.Counter[tuple[str, int]]:
    """What an exactly-once running count emits: (w, 1), (w, 2), ... (w, n), each once."""
    return collections.Counter((w, i) for w, n in counts.items() for i in range(1, n + 1))


def final_counts(records: list[Any]) -> dict[str, int]:
    out: dict[str, int] = {}
    for w, c in records:
        out[w] = max(out.get(w, 0), c)
    return out


def _first(t: Any) -> Any:
    return t[0]


def diamond(n: int, rate: float | None = None, **config: Any) -> Dataflow:
    """One source, two branches with different key_bys, a union, a keyed aggregation,
    two sinks: "totals" ((tag, key), running count) and "by5" ((key, running count))."""
    flow = Dataflow("diamond", parallelism=2, **config)
    src = flow.source(GeneratorSource(lambda i: i, n, rate=rate), name="numbers")
    by3 = (
        src.map(lambda x: (x % 3, 1), name="pair3")
        .key_by(_first)
        .reduce(lambda a, b: (a[0], a[1] + b[1]), name="count3")
    )
    by5 = src.key_by(lambda x: x % 5).aggregate(0, lambda c, _x: c + 1, name="count5")
    by5.collect("by5")
    tagged = by3.map(lambda t: ("three", t[0]), name="tag3").union(
        by5.map(lambda t: ("five", t[0]), name="tag5"), name="both"
    )
    tagged.key_by(lambda t: t).aggregate(0, lambda c, _t: c + 1, name="per_key").collect("totals")
    return flow


def diamond_expected(n: int) -> dict[str, collections.Counter[Any]]:
    totals: collections.Counter[Any] = collections.Counter()
    by5: collections.Counter[Any] = collections.Counter()
    for mod, tag in ((3, "three"), (5, "five")):
        sizes = collections.Counter(i % mod for i in range(n))
        for k, size in sizes.items():
            for c in range(1, size + 1):
                totals[((tag, k), c)] += 1
                if mod == 5:
                    by5[(k, c)] += 1
    return {"totals": totals, "by5": by5}


def slow_branch(n: int, **config: Any) -> Dataflow:
    """Two sources into one keyed count. The "lagging" source runs through a slow map
    in its own task, so it answers a trigger only after its current ~0.8 s batch: its
    barrier reaches the union "merge" long after the fast source's (alignment matters)."""
    flow = Dataflow("skewed", parallelism=1, **config)

    def slow(x: int) -> int:
        time.sleep(0.0008)
        return x

    fast = flow.source(GeneratorSource(lambda i: 2 * i, n, rate=n / 2), name="fast")
    # not rate limited: always busy with a full 1000-record batch (~0.8 s)
    lagging = flow.source(GeneratorSource(lambda i: 2 * i + 1, n // 8), name="lagging")
    (
        lagging.map(slow, name="slow")
        .union(fast, name="merge")
        .key_by(lambda x: x % 10)
        .aggregate(0, lambda c, _x: c + 1, name="count")
        .collect("counts")
    )
    return flow


def _square(x: int) -> int:
    return x * x


def pipeline(
    n: int, rate: float | None = 8_000, files: str | None = None, **config: Any
) -> Dataflow:
    """source (2) -> rebalance -> map "square" (2) -> key_by -> "count" (2) -> rebalance ->
    sink "out" (1): every kind of task (source, middle, keyed, sink) is its own task.
    With ``files``, the sink is an exactly-once FileSink "files" (2 part files) there."""
    from runtime.sinks import FileSink

    flow = Dataflow("pipeline", parallelism=2, **config)
    counts = (
        flow.source(GeneratorSource(lambda i: i, n, rate=rate), name="numbers")
        .rebalance()
        .map(_square, name="square")
        .key_by(lambda x: x % 17)
        .aggregate(0, lambda c, _x: c + 1, name="count")
        .rebalance()
    )
    if files is None:
        counts.collect("out", parallelism=1)
    else:
        counts.sink(FileSink(files), name="files")
    return flow


def pipeline_expected(n: int) -> collections.Counter[Any]:
    sizes = collections.Counter((i * i) % 17 for i in range(n))
    return collections.Counter((k, c) for k, size in sizes.items() for c in range(1, size + 1))


def slow_words(paths: list[str], **config: Any) -> Dataflow:
    """Word count whose split step is slowed down, so kills land in the middle of the job."""
    flow = Dataflow("wordcount", parallelism=2, **config)

    def split_slowly(line: str) -> list[str]:
        time.sleep(0.0002)
        return line.split()

    (
        flow.source(TextFileSource(paths), name="lines")
        .flat_map(split_slowly, name="split")
        .key_by(lambda w: w)
        .aggregate(0, lambda c, _w: c + 1, name="count")
        .collect("counts")
    )
    return flow


def read_part_files(directory: str) -> collections.Counter[Any]:
    import glob
    import json

    records: collections.Counter[Any] = collections.Counter()
    for path in glob.glob(f"{directory}/part-*"):
        with open(path) as fh:
            records.update(tuple(json.loads(line)) for line in fh)
    return records


def keyed_sums(
    name: str,
    n: int,
    parallelism: int = 2,
    rate: float | None = None,
    keys: int = 3000,
    hot: int | None = None,
    **config: Any,
) -> Dataflow:
    """A running sum per key over ``n`` records, collected as ``sums``: every key once,
    then ``hot`` of the keys (a tenth by default) hot (the state the incremental and
    RocksDB tests change)."""
    hot_keys = keys // 10 if hot is None else hot

    def record(i: int) -> tuple[int, int]:
        key = i % keys if i < keys else (i * 7) % hot_keys
        return key, i % 7

    flow = Dataflow(name, parallelism=parallelism, ui=False, **config)
    (
        flow.source(GeneratorSource(record, n, rate=rate), name="numbers")
        .key_by(_first)
        .aggregate(0, lambda acc, r: acc + r[1], name="sum")
        .collect("sums")
    )
    return flow


class _HeldReader(SourceReader[Any]):
    """A generator reader that, once its records are out, ends only after a checkpoint
    numbered ``held_until`` or later has completed in ``checkpoint_dir``."""

    def __init__(self, inner: SourceReader[Any], checkpoint_dir: str, held_until: int) -> None:
        self.inner, self.held_until = inner, held_until
        self.storage = CheckpointStorage(checkpoint_dir)

    def read_batch(self, max_records: int) -> list[Any] | None:
        batch = self.inner.read_batch(max_records)
        if batch is not None:
            return batch
        if any(n >= self.held_until for n in self.storage.completed_checkpoints()):
            return None
        time.sleep(0.02)  # a poll of the checkpoint directory, barriers go on meanwhile
        return []

    def snapshot(self) -> object:
        return self.inner.snapshot()

    def restore(self, state: Any) -> None:
        self.inner.restore(state)


class HeldGenerator(Source[Any]):
    """``GeneratorSource(fn, count, rate)`` whose input ends only once checkpoint
    ``held_until`` has completed: a fault after that checkpoint always fires, however
    slowly the machine takes checkpoints."""

    name = "held-generator"

    def __init__(
        self, fn: Any, count: int, checkpoint_dir: str, held_until: int, rate: float | None = None
    ) -> None:
        self.inner = GeneratorSource(fn, count, rate)
        self.checkpoint_dir, self.held_until = checkpoint_dir, held_until

    def create_reader(self, subtask: int, parallelism: int) -> SourceReader[Any]:
        inner = self.inner.create_reader(subtask, parallelism)
        return _HeldReader(inner, self.checkpoint_dir, self.held_until)
