"""The two-phase-commit sinks (runtime/sinks.py), driven by hand (the source readers: test_sources)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime.errors import RecordSerializationError
from runtime.sinks import CollectSink, FileSink, SinkContext
from tests.runtime.test_sources import through_msgpack


# -- GeneratorSource -------------------------------------------------------------------------
# -- CollectionSource ------------------------------------------------------------------------
# -- TextFileSource --------------------------------------------------------------------------
# -- FileSink --------------------------------------------------------------------------------
class Driver:
    """A fake send_to_driver that records (checkpoint id, records)."""

    def __init__(self) -> None:
        self.received: list[tuple[int, list[Any]]] = []

    def __call__(self, checkpoint_id: int, records: list[Any] | bytes) -> None:
        if isinstance(records, bytes):  # a packed list, as the driver unpacks it
            records = list(msgpack.unpackb(records, raw=False, use_list=False))
        self.received.append((checkpoint_id, records))


def ctx(subtask: int = 0, attempt: int = 0, driver: Driver | None = None) -> SinkContext:
    return SinkContext("out", subtask, 2, attempt, driver or Driver())


def open_file_sink(directory: Path, subtask: int = 0, attempt: int = 0) -> FileSink:
    sink = FileSink(str(directory))
    sink.open(ctx(subtask, attempt))
    return sink


def part(directory: Path, subtask: int = 0) -> list[Any]:
    path = directory / f"part-{subtask}"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


def staging_files(directory: Path) -> list[str]:
    return sorted(n for n in os.listdir(directory) if n.endswith(".staging"))


def test_file_sink_commits_on_checkpoint_complete(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path, subtask=1)
    sink.write_batch([1, {"k": "v"}])
    sink.write_batch(["x"])
    assert part(tmp_path, 1) == []
    state = sink.snapshot_state(1)
    assert part(tmp_path, 1) == []  # pre-committed, not visible yet
    sink.write_batch([2])  # next epoch
    sink.notify_checkpoint_complete(1)
    assert part(tmp_path, 1) == [1, {"k": "v"}, "x"]
    assert not (tmp_path / "part-0").exists()
    assert state["pending"][0][0] == 1
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    assert part(tmp_path, 1) == [1, {"k": "v"}, "x", 2]
    sink.close()
    assert staging_files(tmp_path) == []


def test_file_sink_custom_format(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path), format=lambda r: f"<{r}>")
    sink.open(ctx())
    sink.write_batch([1, 2])
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    assert (tmp_path / "part-0").read_text() == "<1>\n<2>\n"


def test_file_sink_commit_is_idempotent(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path)
    sink.write_batch(["a"])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.notify_checkpoint_complete(1)  # repeated notice
    assert part(tmp_path) == ["a"]
    # Committing the same handle again directly is a no-op too.
    sink.commit(1, state1["pending"][0][1])
    assert part(tmp_path) == ["a"]


def test_file_sink_lost_notice_is_committed_by_the_next(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path)
    sink.write_batch(["a"])
    sink.snapshot_state(1)
    sink.write_batch(["b"])
    sink.snapshot_state(2)
    # The notice of 1 is lost; 2 commits both, in order.
    sink.notify_checkpoint_complete(2)
    assert part(tmp_path) == ["a", "b"]
    sink.notify_checkpoint_complete(1)  # arrives late: harmless
    assert part(tmp_path) == ["a", "b"]


def test_file_sink_restore_rolls_back_uncommitted(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path, attempt=0)
    sink.write_batch(["a"])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.write_batch(["b"])
    sink.snapshot_state(2)  # pre-committed, never completed
    sink.write_batch(["c"])  # open transaction
    # Crash (no close); restart from checkpoint 1.
    fresh = open_file_sink(tmp_path, attempt=1)
    fresh.restore_state(through_msgpack(state1))
    assert part(tmp_path) == ["a"]
    assert staging_files(tmp_path) == [".part-0.1.open.staging"]
    fresh.write_batch(["b", "c"])  # the replay
    fresh.snapshot_state(3)
    fresh.notify_checkpoint_complete(3)
    assert part(tmp_path) == ["a", "b", "c"]


def test_file_sink_restore_commits_pending_of_the_snapshot(tmp_path: Path) -> None:
    """Checkpoint 2 completed but its notice never reached the sink: restore commits it."""
    sink = open_file_sink(tmp_path, attempt=0)
    sink.write_batch(["a"])
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.write_batch(["b"])
    state2 = sink.snapshot_state(2)
    sink.write_batch(["c"])
    fresh = open_file_sink(tmp_path, attempt=1)
    fresh.restore_state(through_msgpack(state2))
    assert part(tmp_path) == ["a", "b"]
    fresh.restore_state(through_msgpack(state2))  # restoring twice is harmless
    assert part(tmp_path) == ["a", "b"]


def test_file_sink_restore_truncates_a_half_done_append(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path, attempt=0)
    sink.write_batch(["a"])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    with open(tmp_path / "part-0", "a") as fh:  # a crash mid-commit left extra bytes
        fh.write('"partial')
    fresh = open_file_sink(tmp_path, attempt=1)
    fresh.restore_state(through_msgpack(state1))
    assert part(tmp_path) == ["a"]


def test_file_sink_restore_from_an_older_snapshot_truncates_back(tmp_path: Path) -> None:
    """Checkpoint 2 committed, then the job restores from checkpoint 1 (e.g. chk-2 turned
    out corrupt, or restore_from names chk-1): the output of epoch 2 is replayed, so the
    part file must go back to its length at checkpoint 1."""
    sink = open_file_sink(tmp_path, attempt=0)
    sink.write_batch(["a"])
    state1 = sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    sink.write_batch(["b"])
    sink.snapshot_state(2)
    sink.notify_checkpoint_complete(2)
    assert part(tmp_path) == ["a", "b"]
    fresh = open_file_sink(tmp_path, attempt=1)
    fresh.restore_state(through_msgpack(state1))
    assert part(tmp_path) == ["a"]
    fresh.write_batch(["b"])  # replay of epoch 2
    fresh.snapshot_state(3)
    fresh.notify_checkpoint_complete(3)
    assert part(tmp_path) == ["a", "b"]


def test_file_sink_restore_without_state_rolls_back_everything_uncommitted(tmp_path: Path) -> None:
    sink = open_file_sink(tmp_path, attempt=0)
    sink.write_batch(["a"])
    sink.snapshot_state(1)
    fresh = open_file_sink(tmp_path, attempt=1)
    fresh.restore_state(None)
    assert part(tmp_path) == []
    assert staging_files(tmp_path) == [".part-0.1.open.staging"]


def test_file_sinks_of_two_subtasks_do_not_interfere(tmp_path: Path) -> None:
    s0, s1 = open_file_sink(tmp_path, 0), open_file_sink(tmp_path, 1)
    s0.write_batch([0])
    s1.write_batch([1])
    s0.snapshot_state(1)
    s1.snapshot_state(1)
    s0.notify_checkpoint_complete(1)
    fresh1 = open_file_sink(tmp_path, 1, attempt=1)
    fresh1.restore_state(None)  # rolls back subtask 1 only
    assert part(tmp_path, 0) == [0]
    assert part(tmp_path, 1) == []
    assert ".part-0.0.open.staging" in staging_files(tmp_path)  # s0's open transaction
    s0.snapshot_state(2)
    s0.notify_checkpoint_complete(2)
    assert part(tmp_path, 0) == [0]


# -- CollectSink -----------------------------------------------------------------------------
def test_collect_sink_sends_each_committed_transaction_once_in_order() -> None:
    driver = Driver()
    sink = CollectSink()
    sink.open(ctx(driver=driver))
    sink.write_batch([1, 2])
    sink.snapshot_state(1)
    sink.write_batch([3])
    sink.snapshot_state(2)
    sink.write_batch([4])
    sink.snapshot_state(3)
    assert driver.received == []
    sink.notify_checkpoint_complete(2)
    assert driver.received == [(1, [1, 2]), (2, [3])]
    sink.notify_checkpoint_complete(2)
    sink.notify_checkpoint_complete(1)
    assert driver.received == [(1, [1, 2]), (2, [3])]
    sink.write_batch([5])
    sink.snapshot_state(4)
    sink.notify_checkpoint_complete(4)
    assert driver.received == [(1, [1, 2]), (2, [3]), (3, [4]), (4, [5])]


def test_collect_sink_empty_epoch_is_sent_empty() -> None:
    driver = Driver()
    sink = CollectSink()
    sink.open(ctx(driver=driver))
    sink.snapshot_state(1)
    sink.notify_checkpoint_complete(1)
    assert driver.received == [(1, [])]


def test_collect_sink_restore_recommits_pending_of_the_snapshot() -> None:
    driver = Driver()
    sink = CollectSink()
    sink.open(ctx(driver=driver))
    sink.write_batch(["a"])
    state = through_msgpack(sink.snapshot_state(1))
    again = Driver()
    fresh = CollectSink()
    fresh.open(ctx(attempt=1, driver=again))
    fresh.restore_state(state)
    # Sent again: the driver keeps the first copy per (step, subtask, checkpoint).
    assert again.received == [(1, ["a"])]


def test_collect_sink_restores_transactions_of_older_checkpoints() -> None:
    """Checkpoints written before transactions were packed hold the records themselves."""
    again = Driver()
    fresh = CollectSink()
    fresh.open(ctx(driver=again))
    fresh.restore_state(through_msgpack({"pending": [[1, ["a", ("b", 2)]]]}))
    assert again.received == [(1, ["a", ("b", 2)])]


def test_collect_sink_packs_batches_into_one_transaction() -> None:
    """Batches of every size (msgpack's three list headers) seal into one list."""
    driver = Driver()
    sink = CollectSink()
    sink.open(ctx(driver=driver))
    batches = [list(range(n)) for n in (3, 0, 20, 70_000)]
    for batch in batches:
        sink.write_batch(batch)
    state = through_msgpack(sink.snapshot_state(1))
    fresh = CollectSink()
    fresh.open(ctx(attempt=1, driver=driver))
    fresh.restore_state(state)
    expected = [r for batch in batches for r in batch]
    assert driver.received == [(1, expected)]


def test_collect_sink_names_the_step_that_produced_an_unserializable_record() -> None:
    sink = CollectSink()
    sink.open(SinkContext("out", 0, 1, 0, Driver(), producer="to_set"))
    sink.write_batch([0])
    with pytest.raises(RecordSerializationError) as info:
        sink.write_batch([1, ("k", {2, 3})])  # as it arrives, not at the next barrier
    err = info.value
    assert (err.step, err.index, err.offending_type) == ("to_set", 1, "set")
    message = str(err)
    assert "step 'to_set' emitted a record that cannot cross tasks" in message
    assert "('k', {2, 3})" in message
    assert "None, bool, int, float, str, bytes, tuples/lists, dicts" in message
    assert "convert the set to a list/tuple" in message
    assert isinstance(err, TypeError) and isinstance(err.__cause__, TypeError)


def test_print_sink_prints_each_record_with_its_subtask(capsys: Any) -> None:
    from runtime.sinks import PrintSink

    sink = PrintSink(prefix="> ")
    sink.open(SinkContext("show", 1, 2, 0, lambda n, records: None))
    sink.write_batch([("a", 1), "b"])
    assert capsys.readouterr().out == "> show[1]> ('a', 1)\n> show[1]> b\n"
