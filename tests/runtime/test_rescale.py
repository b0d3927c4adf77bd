"""Union state at another parallelism, without a job: the file source's positions are
redistributed so no record is skipped or repeated, a transactional sink's old subtasks
are recovered exactly once, and the restore plan hands every old state to each new
subtask. Each with a companion showing what the naive restore (each new subtask takes
the old state of its own index) gets wrong."""

from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime.connectors.files import FileStreamReader, FileStreamSource
from runtime.sinks import CollectSink, FileSink, SinkContext
from runtime.sources import CollectionSource, GeneratorSource, Source
from statebackend.errors import IncompatibleCheckpointError
from statebackend.metadata import CheckpointMetadata, OperatorLayout, StepState, TaskStateHandle
from statebackend.metrics import CheckpointSummary
from statebackend.restore import RescaledState, RestoreTarget, check_compatible, plan_restore

FILES, LINES = 7, 40


def write_inputs(directory: Path) -> collections.Counter[tuple[int, int]]:
    directory.mkdir()
    for f in range(FILES):
        lines = "".join(json.dumps({"f": f, "l": i}) + "\n" for i in range(LINES))
        (directory / f"in-{f}.jsonl").write_text(lines)
    return collections.Counter((f, i) for f in range(FILES) for i in range(LINES))


def readers(source: FileStreamSource, parallelism: int) -> list[FileStreamReader]:
    out = []
    for i in range(parallelism):
        reader = source.create_reader(i, parallelism)
        assert isinstance(reader, FileStreamReader)
        out.append(reader)
    return out


def keys(records: list[Any]) -> list[tuple[int, int]]:
    return [(r["f"], r["l"]) for r in records]


def read_part_way(source: FileStreamSource) -> tuple[list[Any], list[tuple[int, int]]]:
    """Subtasks 0 and 1 of 2 read 50 records each (some files done, one open in each):
    their snapshots and what they emitted."""
    emitted: list[tuple[int, int]] = []
    states = []
    for reader in readers(source, 2):
        for _ in range(5):
            emitted += keys(reader.read_batch(10) or [])
        assert reader.current is not None and reader.offset > 0  # mid-file
        states.append(reader.snapshot())
        reader.close()
    return states, emitted


def read_rest(reader: FileStreamReader) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    while (batch := reader.read_batch(16)) is not None:
        out += keys(batch)
    reader.close()
    return out


def by_file_number(path: str, parallelism: int) -> int:
    """Owner of ``in-<f>.jsonl``: f mod parallelism, a layout fixed across runs."""
    return int(path.rsplit("-", 1)[-1].split(".")[0]) % parallelism


@pytest.mark.parametrize("by_number", [False, True], ids=["crc32", "by-number"])
@pytest.mark.parametrize("parallelism", [1, 3])
def test_the_file_source_redistributes_its_splits(
    tmp_path: Path, parallelism: int, by_number: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if by_number:  # the companion's layout
        monkeypatch.setattr("runtime.connectors.files._owner", by_file_number)
    want = write_inputs(tmp_path / "in")
    source = FileStreamSource(str(tmp_path / "in"))
    states, emitted = read_part_way(source)
    rescaled = RescaledState(((0, states[0]), (1, states[1])), 2)
    for reader in readers(source, parallelism):
        reader.restore_rescaled(rescaled)
        emitted += read_rest(reader)
    assert collections.Counter(emitted) == want  # each record exactly once


@pytest.mark.parametrize("parallelism", [1, 3])
def test_companion_restoring_each_subtask_from_its_own_index_repeats_records(
    tmp_path: Path, parallelism: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The owners come from the crc32 of the paths, which hold the random temp dir; in
    # about 1 layout in 81 the naive restore at 3 happens to read each record once (a CI
    # run drew one). With files owned by number, old subtask 0 has read file 0 and 10
    # lines of file 2, old 1 file 1 and 10 lines of file 3; the naive restore re-reads
    # file 1 at 1, and at 3 the open files 2 and 3 from their start.
    monkeypatch.setattr("runtime.connectors.files._owner", by_file_number)
    want = write_inputs(tmp_path / "in")
    source = FileStreamSource(str(tmp_path / "in"))
    states, emitted = read_part_way(source)
    for i, reader in enumerate(readers(source, parallelism)):
        if i < len(states):
            reader.restore(states[i])
        emitted += read_rest(reader)
    got = collections.Counter(emitted)
    assert got != want and max(got.values()) > 1  # files done by another index re-read


# -- strided sources (GeneratorSource, CollectionSource) ---------------------------------
COUNT = 100


def strided_sources() -> list[Source]:
    return [GeneratorSource(lambda i: i, COUNT), CollectionSource(range(COUNT))]


def read_unevenly(source: Source, parallelism: int, rounds: int) -> tuple[list[Any], list[Any]]:
    """Subtask i reads ``rounds + i`` batches of 3; the snapshots and what was read."""
    states, emitted = [], []
    for i in range(parallelism):
        reader = source.create_reader(i, parallelism)
        for _ in range(rounds + i):
            emitted += reader.read_batch(3) or []
        states.append(through_msgpack(reader.snapshot()))
    return states, emitted


def through_msgpack(state: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(state), raw=False)


@pytest.mark.parametrize("source", strided_sources(), ids=["generator", "collection"])
def test_strided_sources_redistribute_twice_without_loss_or_repeat(source: Source) -> None:
    states, emitted = read_unevenly(source, 2, 2)
    # 2 -> 3: the new subtasks read unevenly too, and are rescaled again, 3 -> 1.
    again = []
    for i in range(3):
        reader = source.create_reader(i, 3)
        reader.restore_rescaled(RescaledState(tuple(enumerate(states)), 2))
        for _ in range(i):
            emitted += reader.read_batch(2) or []
        again.append(through_msgpack(reader.snapshot()))
    last = source.create_reader(0, 1)
    last.restore_rescaled(RescaledState(tuple(enumerate(again)), 3))
    while (batch := last.read_batch(7)) is not None:
        emitted += batch
    assert sorted(emitted) == list(range(COUNT))


@pytest.mark.parametrize("source", strided_sources(), ids=["generator", "collection"])
def test_companion_strided_sources_restored_per_index_lose_or_repeat(source: Source) -> None:
    states, emitted = read_unevenly(source, 2, 2)
    for i in range(3):
        reader = source.create_reader(i, 3)
        if i < 2:
            reader.restore(states[i])
        while (batch := reader.read_batch(7)) is not None:
            emitted += batch
    assert sorted(emitted) != list(range(COUNT))


# -- transactional sinks ------------------------------------------------------------------
def unpacked(records: list[Any] | bytes) -> list[Any]:
    """A batch as the driver reads it (a packed list is unpacked)."""
    if isinstance(records, bytes):
        return list(msgpack.unpackb(records, raw=False, use_list=False))
    return records


class Driver:
    """Committed output as the driver receives it: (subtask, checkpoint) -> records."""

    def __init__(self) -> None:
        self.got: dict[tuple[int, int], list[Any]] = {}

    def context(self, subtask: int, parallelism: int) -> SinkContext:
        def send(n: int, records: list[Any] | bytes) -> None:
            self.got.setdefault((subtask, n), unpacked(records))  # the first copy, as the driver

        def send_as(j: int, n: int, records: list[Any] | bytes) -> None:
            self.got.setdefault((j, n), unpacked(records))

        return SinkContext("out", subtask, parallelism, 0, send, job="j", send_as=send_as)


def sealed_at(sink_type: type, parallelism: int, driver: Driver, **kw: Any) -> list[Any]:
    """Each subtask writes records and pre-commits them at checkpoint 5, and writes more
    after it (an open transaction no checkpoint covers); the snapshots of 5."""
    states = []
    for i in range(parallelism):
        sink = sink_type(**kw)
        sink.open(driver.context(i, parallelism))
        sink.restore_state(None)
        sink.write_batch([f"r{i}-{k}" for k in range(3)])
        states.append(sink.snapshot_state(5))
        sink.write_batch([f"late{i}"])
        if isinstance(sink, FileSink):
            assert sink.current is not None
            sink.current.fh.flush()  # a crash: the staging file stays
    return states


def test_a_rescaled_collect_sink_commits_every_old_subtask_once_under_its_index() -> None:
    driver = Driver()
    states = sealed_at(CollectSink, 3, driver)
    rescaled = RescaledState(tuple(enumerate(states)), 3)
    for i in range(2):
        sink = CollectSink()
        sink.open(driver.context(i, 2))
        sink.restore_state(rescaled)
        assert sink.next_id == 6  # new transactions: checkpoints above the restored one
    assert driver.got == {(i, 5): [f"r{i}-{k}" for k in range(3)] for i in range(3)}


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_rescaled_file_sink_commits_and_aborts_each_old_subtask(
    tmp_path: Path, parallelism: int
) -> None:
    out = tmp_path / "out"
    states = sealed_at(FileSink, 2, Driver(), directory=str(out))
    rescaled = RescaledState(tuple(enumerate(states)), 2)
    sinks = []
    for i in range(parallelism):
        sink = FileSink(str(out))
        sink.open(Driver().context(i, parallelism))
        sink.restore_state(rescaled)
        sinks.append(sink)
    for i in range(2):
        lines = (out / f"part-{i}").read_text().split()
        assert lines == [json.dumps(f"r{i}-{k}") for k in range(3)]  # no 'late': aborted
    staging = sorted(p.name for p in out.iterdir() if p.name.endswith(".staging"))
    assert staging == [f".part-{i}.0.open.staging" for i in range(parallelism)]  # new ones
    for sink in sinks:
        sink.close()


def test_companion_without_redistribution_old_subtasks_are_lost(tmp_path: Path) -> None:
    out = tmp_path / "out"
    states = sealed_at(FileSink, 2, Driver(), directory=str(out))
    sink = FileSink(str(out))
    sink.open(Driver().context(0, 1))
    sink.restore_state(states[0])  # only its own index's state
    sink.close()
    assert not (out / "part-1").exists()  # subtask 1's sealed records never committed


# -- the restore plan ---------------------------------------------------------------------
def metadata(redistribute: bool) -> CheckpointMetadata:
    tasks = {
        f"t{i}": TaskStateHandle(f"t{i}.state", 10, 0, {"src": OperatorLayout(i, 2)})
        for i in range(2)
    }
    steps = (StepState("src", "source", 2, False, "", redistribute),)
    return CheckpointMetadata(
        7, "j", 0, True, 1.0, 2.0, 1.0, 128, tasks, {}, CheckpointSummary(), steps
    )


def test_the_plan_hands_every_old_state_to_each_new_subtask() -> None:
    meta = metadata(True)
    new = StepState("src", "source", 3, False, "", True)
    assert check_compatible(meta, [new], "j", 128) == []
    for subtask in range(3):
        part = plan_restore(meta, subtask, [RestoreTarget(new)]).operators["src"]
        assert [j for j, _ in part.rescaled] == [0, 1] and part.old_parallelism == 2
        assert part.operator_state is None


def test_companion_state_that_is_not_union_state_is_refused_at_another_parallelism() -> None:
    new = StepState("src", "source", 3, False)
    with pytest.raises(IncompatibleCheckpointError, match="cannot be redistributed"):
        check_compatible(metadata(False), [new], "j", 128)
    with pytest.raises(IncompatibleCheckpointError, match="not keyed"):
        plan_restore(metadata(False), 0, [RestoreTarget(new)])
