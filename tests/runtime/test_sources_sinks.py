"""Source readers (partitioning, exact resume) and the two-phase-commit sinks, driven by hand."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime.errors import RecordSerializationError
from runtime.sinks import CollectSink, FileSink, SinkContext
from runtime.sources import CollectionSource, GeneratorSource, SourceReader, TextFileSource


def square(i: int) -> int:
    return i * i


def drain(reader: SourceReader, batch: int = 7, limit: int | None = None) -> list[Any]:
    """Read until the input ends (or ``limit`` records were read, batch by batch)."""
    out: list[Any] = []
    while limit is None or len(out) < limit:
        records = reader.read_batch(batch)
        if records is None:
            break
        out.extend(records)
    return out


def through_msgpack(state: Any) -> Any:
    """A snapshot travels in a msgpack state file: lists come back as tuples."""
    return msgpack.unpackb(msgpack.packb(state), use_list=False)


# -- GeneratorSource -------------------------------------------------------------------------
@pytest.mark.parametrize("p", [1, 2, 3, 7])
def test_generator_subtask_reads_its_stride(p: int) -> None:
    src = GeneratorSource(square, 50)
    for s in range(p):
        assert drain(src.create_reader(s, p)) == [square(i) for i in range(s, 50, p)]


def test_generator_ended_reader_keeps_returning_none() -> None:
    reader = GeneratorSource(square, 3).create_reader(0, 1)
    assert reader.read_batch(10) == [0, 1, 4]
    assert reader.read_batch(10) is None
    assert reader.read_batch(10) is None


def test_generator_empty() -> None:
    assert GeneratorSource(square, 0).create_reader(0, 2).read_batch(5) is None


def test_generator_snapshot_restore_resumes_exactly() -> None:
    src = GeneratorSource(square, 100)
    reader = src.create_reader(1, 3)
    head = drain(reader, batch=4, limit=12)
    state = through_msgpack(reader.snapshot())
    tail = drain(reader)
    fresh = src.create_reader(1, 3)
    fresh.restore(state)
    assert drain(fresh) == tail
    assert head + tail == [square(i) for i in range(1, 100, 3)]


def test_generator_unbounded_keeps_going() -> None:
    reader = GeneratorSource(square, None).create_reader(0, 2)
    assert reader.read_batch(3) == [0, 4, 16]
    assert reader.read_batch(2) == [36, 64]


# -- CollectionSource ------------------------------------------------------------------------
def test_collection_source_partitions_and_resumes() -> None:
    items = list("abcdefghij")
    src = CollectionSource(items)
    parts = [drain(src.create_reader(s, 3), batch=2) for s in range(3)]
    assert parts == [items[0::3], items[1::3], items[2::3]]
    reader = src.create_reader(0, 2)
    assert reader.read_batch(2) == ["a", "c"]
    state = through_msgpack(reader.snapshot())
    fresh = src.create_reader(0, 2)
    fresh.restore(state)
    assert drain(fresh) == ["e", "g", "i"]
    assert fresh.read_batch(1) is None


# -- TextFileSource --------------------------------------------------------------------------
def write_files(tmp_path: Path) -> tuple[str, list[str]]:
    """Files with lines of many lengths; returns the glob and all lines in file order."""
    contents = {
        "a.txt": "".join(f"{'x' * (i * 7 % 23)}line-a{i}\n" for i in range(40)),
        "b.txt": "",  # empty file
        "c.txt": "short\n\n\nafter-blank-lines\n" + "y" * 300 + "\nno-trailing-newline",
        "d.txt": "única línea ✓\n",  # multi-byte UTF-8
        "e.txt": "".join(f"e{i}\n" for i in range(5)),
    }
    lines: list[str] = []
    for name, text in contents.items():
        (tmp_path / name).write_bytes(text.encode("utf-8"))
        lines.extend(
            text.split("\n")[:-1] if text.endswith("\n") else text.split("\n") if text else []
        )
    return str(tmp_path / "*.txt"), lines


def is_subsequence(part: list[str], whole: list[str]) -> bool:
    it = iter(whole)
    return all(any(x == y for y in it) for x in part)


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("batch", [1, 4, 1000])
def test_text_source_reads_every_line_exactly_once(tmp_path: Path, p: int, batch: int) -> None:
    pattern, lines = write_files(tmp_path)
    src = TextFileSource(pattern)
    parts = [drain(src.create_reader(s, p), batch=batch) for s in range(p)]
    assert sorted(line for part in parts for line in part) == sorted(lines)
    assert sum(len(part) for part in parts) == len(lines)
    for part in parts:
        assert is_subsequence(part, lines)  # file order within a subtask
    if p == 1:
        assert parts[0] == lines


def test_text_source_more_subtasks_than_bytes(tmp_path: Path) -> None:
    (tmp_path / "tiny.txt").write_text("a\nb\n")
    src = TextFileSource(str(tmp_path / "tiny.txt"))
    parts = [drain(src.create_reader(s, 8)) for s in range(8)]
    assert sorted(x for part in parts for x in part) == ["a", "b"]


@pytest.mark.parametrize("p", [1, 2, 3, 5])
def test_text_source_snapshot_restore_continues_exactly(tmp_path: Path, p: int) -> None:
    pattern, _lines = write_files(tmp_path)
    src = TextFileSource(pattern)
    for s in range(p):
        expected = drain(src.create_reader(s, p))
        for cut in sorted({0, 1, len(expected) // 2, len(expected)}):
            reader = src.create_reader(s, p)
            head = drain(reader, batch=3, limit=cut) if cut else []
            state = through_msgpack(reader.snapshot())
            reader.close()
            fresh = src.create_reader(s, p)
            fresh.restore(state)
            tail = drain(fresh, batch=5)
            fresh.close()
            assert head + tail == expected, (s, cut)


def test_text_source_restore_after_end(tmp_path: Path) -> None:
    pattern, lines = write_files(tmp_path)
    src = TextFileSource(pattern)
    reader = src.create_reader(0, 1)
    assert drain(reader) == lines
    fresh = src.create_reader(0, 1)
    fresh.restore(through_msgpack(reader.snapshot()))
    assert fresh.read_batch(10) is None


def test_text_source_crlf(tmp_path: Path) -> None:
    (tmp_path / "w.txt").write_bytes(b"one\r\ntwo\r\n")
    assert drain(TextFileSource(str(tmp_path / "w.txt")).create_reader(0, 1)) == ["one", "two"]


def test_text_source_list_of_paths(tmp_path: Path) -> None:
    (tmp_path / "1.txt").write_text("first\n")
    (tmp_path / "2.log").write_text("second\n")
    src = TextFileSource([str(tmp_path / "2.log"), str(tmp_path / "*.txt")])
    assert drain(src.create_reader(0, 1)) == ["second", "first"]


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
