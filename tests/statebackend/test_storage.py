import dataclasses
import json
import logging
import os
import zlib
from pathlib import Path

import msgpack
import pytest

from statebackend import (
    CheckpointMetadata,
    CheckpointNotFoundError,
    CheckpointStatus,
    CheckpointStorage,
    CorruptCheckpointError,
    OperatorLayout,
    OperatorSnapshot,
    StepState,
    TaskStateHandle,
)
from statebackend.errors import StorageUsageError
from statebackend.metrics import AckMetrics, CheckpointSummary

TASKS = ("count[0]", "count[1]")


def metadata_of(checkpoint_id: int, tasks: dict[str, TaskStateHandle]) -> CheckpointMetadata:
    return CheckpointMetadata(
        checkpoint_id=checkpoint_id,
        job="wordcount",
        attempt=0,
        final=False,
        trigger_time=1_700_000_000.0,
        completed_time=1_700_000_000.5,
        duration_ms=500.0,
        max_parallelism=128,
        tasks=tasks,
        task_metrics={task: AckMetrics(sync_ms=1.5) for task in tasks},
        metrics=CheckpointSummary(
            tasks=len(tasks), state_bytes=sum(h.size for h in tasks.values())
        ),
        steps=(StepState("source", "source", 2, False),),
    )


def complete_checkpoint(storage: CheckpointStorage, checkpoint_id: int) -> CheckpointMetadata:
    """Write every task's state file, then _metadata (as the tasks and coordinator do)."""
    tasks = {}
    for subtask, task in enumerate(TASKS):
        blob = msgpack.packb({"task": task, "checkpoint": checkpoint_id})
        tasks[task] = storage.write_task_state(
            checkpoint_id,
            task,
            {"source": OperatorSnapshot(blob, None, None)},
            {"source": OperatorLayout(subtask, 2)},
        )
    metadata = metadata_of(checkpoint_id, tasks)
    storage.write_metadata(metadata)
    return metadata


def start_checkpoint(storage: CheckpointStorage, checkpoint_id: int) -> None:
    """A chk-<n> directory without _metadata (in progress, or aborted)."""
    os.makedirs(storage.location(checkpoint_id), exist_ok=True)


def test_layout(tmp_path: Path) -> None:
    root = os.path.join(str(tmp_path), "ckpt")
    storage = CheckpointStorage(root)
    assert not os.path.exists(root)  # the constructor does no I/O
    assert storage.task_state_path(3, "count[1]") == os.path.join(
        storage.root, "chk-3", "count[1].state"
    )
    handle = storage.write_task_state(
        3,
        "count[1]",
        {"count": OperatorSnapshot(msgpack.packb(7), None, None)},
        {"count": OperatorLayout(1, 2)},
    )
    path = os.path.join(storage.root, "chk-3", "count[1].state")
    assert handle == TaskStateHandle(
        "count[1].state",
        os.path.getsize(path),
        zlib.crc32(Path(path).read_bytes()),
        {"count": OperatorLayout(1, 2)},
    )
    assert storage.read_operator_state(3, handle, "count") == msgpack.packb(7)
    assert storage.checkpoint_ids() == [3] and storage.completed_checkpoints() == []
    with pytest.raises(StorageUsageError, match="file name"):
        storage.task_state_path(3, "../x")


def test_metadata_round_trip(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    metadata = complete_checkpoint(storage, 1)
    got = storage.read_metadata(1)
    assert got == metadata
    path = os.path.join(storage.root, "chk-1", "_metadata")
    on_disk = json.loads(Path(path).read_text())
    assert isinstance(on_disk["crc32"], int) and on_disk["job"] == "wordcount"
    assert on_disk["tasks"]["count[1]"]["operators"] == {"source": {"subtask": 1, "parallelism": 2}}
    assert on_disk["steps"] == [
        {"name": "source", "kind": "source", "parallelism": 2, "keyed": False}
    ]
    assert not os.path.exists(path + ".tmp")
    assert storage.completed_checkpoints() == [1]


def test_metadata_without_steps_derives_them_from_the_layouts() -> None:
    handle = TaskStateHandle("c.state", 10, 1, {"count": OperatorLayout(0, 2, (0, 64))})
    text = metadata_of(1, {"count[0]": handle}).to_json()
    body = json.loads(text)
    del body["steps"], body["crc32"]
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    old = json.dumps({**body, "crc32": zlib.crc32(canonical)})
    assert CheckpointMetadata.from_json(old).steps == (StepState("count", "", 2, True),)


def test_list_statuses(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "root"))
    assert storage.list() == []
    complete_checkpoint(storage, 1)
    complete_checkpoint(storage, 2)
    start_checkpoint(storage, 3)
    os.unlink(storage.task_state_path(2, "count[0]"))
    listed = storage.list()
    assert [(i.checkpoint_id, i.status) for i in listed] == [
        (1, CheckpointStatus.COMPLETED),
        (2, CheckpointStatus.CORRUPT),
        (3, CheckpointStatus.INCOMPLETE),
    ]
    assert listed[0].metadata == storage.read_metadata(1) and listed[0].problem is None
    assert listed[1].metadata is not None and "missing" in str(listed[1].problem)
    assert listed[2].metadata is None


def test_metadata_checksum_mismatch(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    complete_checkpoint(storage, 1)
    path = os.path.join(storage.root, "chk-1", "_metadata")
    text = Path(path).read_text().replace("wordcount", "wordcounT")
    Path(path).write_text(text)
    with pytest.raises(CorruptCheckpointError, match="checksum"):
        storage.read_metadata(1)
    Path(path).write_text("{not json")
    with pytest.raises(CorruptCheckpointError, match="not valid JSON"):
        storage.read_metadata(1)


def test_missing_metadata(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    start_checkpoint(storage, 4)
    with pytest.raises(CheckpointNotFoundError, match="chk-4") as err:
        storage.read_metadata(4)
    assert isinstance(err.value, FileNotFoundError)
    assert "python -m jobmanager checkpoints" in str(err.value)


def test_latest_valid_falls_back(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    storage = CheckpointStorage(str(tmp_path))
    for n in (1, 2, 3):
        complete_checkpoint(storage, n)
    # chk-3: one state file bit-flipped (same size: only the crc can tell)
    bad = storage.task_state_path(3, "count[1]")
    data = bytearray(Path(bad).read_bytes())
    data[-3] ^= 0xFF
    Path(bad).write_bytes(bytes(data))
    # chk-4: state files written but no _metadata (failed before completing)
    start_checkpoint(storage, 4)
    with caplog.at_level(logging.WARNING, logger="absflow.statebackend"):
        found = storage.latest_valid()
    assert found is not None and found[0] == 2
    assert found[1].tasks["count[0]"].file == "count[0].state"
    messages = [r.getMessage() for r in caplog.records if r.name == "absflow.statebackend"]
    assert any("checkpoint 4" in m and "_metadata" in m for m in messages)
    assert any("checkpoint 3" in m and "count[1]" in m and "crc32" in m for m in messages)
    # without file verification, the size check alone cannot see the flipped byte
    found_unverified = storage.latest_valid(verify_files=False)
    assert found_unverified is not None and found_unverified[0] == 3


def test_latest_valid_skips_missing_state_file(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    complete_checkpoint(storage, 1)
    complete_checkpoint(storage, 2)
    os.unlink(storage.task_state_path(2, "count[0]"))
    assert storage.latest_valid(verify_files=False) == (1, storage.read_metadata(1))


def test_latest_valid_none(tmp_path: Path) -> None:
    assert CheckpointStorage(str(tmp_path)).latest_valid() is None


def test_retain(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    for n in (1, 2, 3, 4, 5):
        complete_checkpoint(storage, n)
    start_checkpoint(storage, 0)  # aborted, older than the newest completed
    start_checkpoint(storage, 6)  # in progress
    os.unlink(os.path.join(storage.root, "chk-2", "_metadata"))  # aborted / incomplete
    assert storage.retain(2) == [0, 1, 2, 3]
    assert storage.completed_checkpoints() == [4, 5]
    assert sorted(os.listdir(storage.root)) == ["chk-4", "chk-5", "chk-6"]
    assert storage.retain(2) == []
    with pytest.raises(ValueError):
        storage.retain(0)


def test_retain_keeps_savepoints_without_reading_back_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = CheckpointStorage(str(tmp_path))
    for n in (1, 2, 3, 4):
        metadata = complete_checkpoint(storage, n)
        if n == 2:
            storage.write_metadata(dataclasses.replace(metadata, savepoint=True))
    # Another instance (a restarted job manager) must read the flags once.
    other = CheckpointStorage(str(tmp_path))
    reads: list[int] = []
    read = CheckpointStorage.read_metadata

    def counting(self: CheckpointStorage, checkpoint_id: int) -> CheckpointMetadata:
        reads.append(checkpoint_id)
        return read(self, checkpoint_id)

    monkeypatch.setattr(CheckpointStorage, "read_metadata", counting)
    assert storage.retain(1) == [1, 3] and reads == []  # it wrote all four
    assert storage.completed_checkpoints() == [2, 4]
    complete_checkpoint(other, 5)
    assert other.retain(1) == [4] and reads == [2, 4]  # read once each
    assert other.retain(1) == [] and reads == [2, 4]
    assert other.savepoints() == [2]


def test_discard(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    complete_checkpoint(storage, 1)
    storage.discard(1)
    storage.discard(1)
    assert storage.completed_checkpoints() == [] and os.listdir(storage.root) == []


def test_resolve(tmp_path: Path) -> None:
    root = os.path.join(str(tmp_path), "ckpt")
    storage = CheckpointStorage(root)
    complete_checkpoint(storage, 1)
    complete_checkpoint(storage, 2)
    s, n = CheckpointStorage.resolve(root)
    assert (s.root, n) == (storage.root, 2)
    s, n = CheckpointStorage.resolve(os.path.join(root, "chk-1"))
    assert (s.root, n) == (storage.root, 1)
    s, n = CheckpointStorage.resolve("file://" + os.path.join(root, "chk-2", "_metadata"))
    assert n == 2


def test_resolve_errors(tmp_path: Path) -> None:
    missing = os.path.join(str(tmp_path), "nope")
    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        CheckpointStorage.resolve(missing)
    assert not os.path.exists(missing)
    empty = os.path.join(str(tmp_path), "empty")
    os.makedirs(os.path.join(empty, "chk-1"))
    with pytest.raises(CheckpointNotFoundError, match=r"no valid checkpoint.*chk-1"):
        CheckpointStorage.resolve(empty)
    with pytest.raises(CheckpointNotFoundError, match="not completed"):
        CheckpointStorage.resolve(os.path.join(empty, "chk-1"))
    storage = CheckpointStorage(os.path.join(str(tmp_path), "bad"))
    complete_checkpoint(storage, 7)
    os.unlink(storage.task_state_path(7, "count[1]"))
    with pytest.raises(CorruptCheckpointError, match="missing"):
        CheckpointStorage.resolve(storage.location(7))
