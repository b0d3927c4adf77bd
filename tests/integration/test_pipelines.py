"""Real pipelines with real ZeroMQ channels and real files, on the test harness (local
task processes without Spark), a few on local Spark."""

from __future__ import annotations

import collections
import json
import os
import time
from typing import Any

import pytest

from runtime import Dataflow, TaskFailedError
from runtime.sinks import FileSink, Sink
from runtime.sources import CollectionSource, GeneratorSource
from tests.integration.topologies import (
    corpus_counts,
    diamond,
    diamond_expected,
    final_counts,
    running_counts,
    wordcount,
    write_corpus,
)

# On the test harness (local task processes); tests marked integration run on local
# Spark (see tests/conftest.py).
pytestmark = [pytest.mark.harness]


def test_wordcount_equals_counter(tmp_path: Any) -> None:
    paths = write_corpus(str(tmp_path), 30_000)
    result = wordcount(paths).run()
    out = result.output("counts")
    assert len(out) == 30_000  # one running count per word
    assert final_counts(out) == corpus_counts(paths)
    assert collections.Counter(out) == running_counts(corpus_counts(paths))
    assert result.restarts == []


@pytest.mark.integration  # also on local Spark
def test_wordcount_at_parallelism_three_with_checkpoints(tmp_path: Any) -> None:
    paths = write_corpus(str(tmp_path), 20_000)
    result = wordcount(
        paths, parallelism=3, checkpoint_interval=0.05, checkpoint_dir=str(tmp_path / "chk")
    ).run()
    # every running count exactly once: a duplicate or a lost record would show here
    assert collections.Counter(result.output("counts")) == running_counts(corpus_counts(paths))
    assert result.checkpoints[-1].final
    metadata = tmp_path / "chk" / f"chk-{result.checkpoints[-1].checkpoint_id}" / "_metadata"
    assert os.path.exists(metadata)
    # Each checkpoint says where every task's barriers were: the same figures as its
    # _metadata, for all six tasks (3 sources with their splitters, 3 counters).
    tasks = result.checkpoints[-1].tasks
    assert {t: m.encode() for t, m in tasks.items()} == json.loads(metadata.read_text())[
        "task_metrics"
    ]
    assert len(tasks) == 6 and all(len(c.tasks) == 6 for c in result.checkpoints)


def test_diamond_gives_exact_output() -> None:
    n = 6_000
    result = diamond(n).run()
    expected = diamond_expected(n)
    assert collections.Counter(result.output("totals")) == expected["totals"]
    assert collections.Counter(result.output("by5")) == expected["by5"]


def test_broadcast_delivers_every_record_to_every_subtask() -> None:
    flow = Dataflow("broadcast", parallelism=1)
    (
        flow.source(CollectionSource(range(500)), name="items")
        .broadcast()
        .map(lambda x: x * 10, name="times10", parallelism=3)
        .collect("out", parallelism=3)
    )
    out = flow.run().output("out")
    assert collections.Counter(out) == collections.Counter({x * 10: 3 for x in range(500)})


def test_rebalance_spreads_records_exactly_once() -> None:
    flow = Dataflow("rebalance", parallelism=1)

    def tag(x: int) -> tuple[int, int]:
        return (x, os.getpid())

    (
        flow.source(CollectionSource(range(3_000)), name="items")
        .rebalance()
        .map(tag, name="tag", parallelism=3)
        .collect("out", parallelism=3)
    )
    out = flow.run().output("out")
    assert sorted(x for x, _ in out) == list(range(3_000))
    assert len({pid for _, pid in out}) == 3  # every subtask got records


def test_filter_flat_map_process_and_file_sink(tmp_path: Any) -> None:
    flow = Dataflow("process", parallelism=2)

    def dedupe(key: Any, value: Any, state: Any) -> list[Any]:
        seen = state.map("seen")
        if value in seen:
            return []
        seen[value] = True
        state.value = (state.value or 0) + 1
        return [(key, value, state.value)]

    (
        flow.source(CollectionSource(list(range(200)) * 2), name="items")
        .filter(lambda x: x % 4 != 0, name="no4")
        .flat_map(lambda x: [x, x], name="twice")
        .key_by(lambda x: x % 7)
        .process(dedupe, name="dedupe")
        .sink(
            FileSink(str(tmp_path / "out"), format=lambda t: f"{t[0]} {t[1]} {t[2]}"), name="files"
        )
    )
    flow.run()
    lines = []
    for i in range(2):
        with open(tmp_path / "out" / f"part-{i}") as fh:
            lines += fh.read().splitlines()
    values = sorted(int(line.split()[1]) for line in lines)
    assert values == [x for x in range(200) if x % 4 != 0]
    per_key = collections.defaultdict(list)
    for line in lines:
        k, _, n = map(int, line.split())
        per_key[k].append(n)
    assert all(sorted(v) == list(range(1, len(v) + 1)) for v in per_key.values())


@pytest.mark.integration  # also on local Spark
def test_udf_error_names_the_operator() -> None:
    flow = Dataflow("boom", parallelism=2)

    def explode(x: int) -> int:
        if x == 1234:
            raise ValueError("bad record 1234")
        return x

    flow.source(CollectionSource(range(5_000)), name="items").map(explode, name="explode").collect()
    with pytest.raises(TaskFailedError) as info:
        flow.run()
    err = info.value
    assert err.operator == "explode"
    assert "explode" in str(err) and "bad record 1234" in str(err)
    assert err.subtask in (0, 1)
    tb = err.remote_traceback or ""
    assert "ValueError: bad record 1234" in tb and "in explode" in tb  # the user's frame


class SlowSink(Sink):
    """Collects via the driver like CollectSink but slowly (backpressure)."""

    def open(self, ctx: Any) -> None:
        super().open(ctx)
        self.records: list[Any] = []

    def write_batch(self, records: list[Any]) -> None:
        time.sleep(0.002)
        self.records.extend(records)

    def notify_checkpoint_complete(self, checkpoint_id: int) -> None:
        self.ctx.send_to_driver(checkpoint_id, self.records)
        self.records = []


def test_slow_sink_loses_nothing_and_keeps_order_per_key() -> None:
    n = 60_000
    flow = Dataflow("slow", parallelism=2, batch_size=100, channel_hwm=4)
    (
        flow.source(GeneratorSource(lambda i: (i % 13, i), n), name="pairs")
        .key_by(lambda kv: kv[0])
        .map(lambda kv: kv, name="same", parallelism=2)
        .rebalance()
        .sink(SlowSink(), name="slow", parallelism=1)
    )
    out = flow.run().output("slow")
    assert len(out) == n
    per_key = collections.defaultdict(list)
    for k, i in out:
        per_key[k].append(i)
    for k, seq in per_key.items():
        # each source subtask emits a key's records in increasing order; per subtask
        # (i parity) the order must survive the channels
        for parity in (0, 1):
            sub = [i for i in seq if i % 2 == parity]
            assert sub == sorted(sub), f"key {k} reordered"
    assert sorted(i for _, i in out) == list(range(n))
