import json
import logging
import os
from pathlib import Path

import msgpack
import pytest

from statebackend import (
    CheckpointNotFoundError,
    CheckpointStorage,
    CorruptCheckpointError,
    OperatorSnapshot,
    write_task_snapshot,
)

TASKS = ("count[0]", "count[1]")


def complete_checkpoint(storage: CheckpointStorage, checkpoint_id: int) -> dict[str, object]:
    """Write every task's state file, then _metadata (as the coordinator does)."""
    tasks = {}
    for task in TASKS:
        path = storage.task_state_path(checkpoint_id, task)
        blob = msgpack.packb({"task": task, "checkpoint": checkpoint_id})
        info = write_task_snapshot(path, {"source": OperatorSnapshot(blob, None, None)})
        tasks[task] = {"file": os.path.basename(path), "size": info.size, "crc32": info.crc32}
    metadata = {"job": "wordcount", "tasks": tasks, "sources": {"s": [1, 2]}}
    storage.write_metadata(checkpoint_id, metadata)
    return metadata


def test_layout(tmp_path: Path) -> None:
    storage = CheckpointStorage(os.path.join(str(tmp_path), "ckpt"))
    assert os.path.isdir(storage.root)
    assert storage.task_state_path(3, "count[1]") == os.path.join(
        storage.root, "chk-3", "count[1].state"
    )
    assert os.path.isdir(storage.checkpoint_dir(3))


def test_metadata_round_trip(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path))
    metadata = complete_checkpoint(storage, 1)
    got = storage.read_metadata(1)
    assert got == {**metadata, "checkpoint_id": 1}
    path = os.path.join(storage.root, "chk-1", "_metadata")
    on_disk = json.loads(Path(path).read_text())
    assert isinstance(on_disk["crc32"], int) and on_disk["job"] == "wordcount"
    assert not os.path.exists(path + ".tmp")
    assert storage.completed_checkpoints() == [1]


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
    storage.task_state_path(4, "count[0]")
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
    storage.task_state_path(4, "count[0]")
    with caplog.at_level(logging.WARNING, logger="absflow.statebackend"):
        found = storage.latest_valid()
    assert found is not None and found[0] == 2
    assert found[1]["tasks"]["count[0]"]["file"] == "count[0].state"
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
    storage.checkpoint_dir(0)  # aborted, older than the newest completed
    storage.checkpoint_dir(6)  # in progress
    os.unlink(os.path.join(storage.root, "chk-2", "_metadata"))  # aborted / incomplete
    assert storage.retain(2) == [0, 1, 2, 3]
    assert storage.completed_checkpoints() == [4, 5]
    assert sorted(os.listdir(storage.root)) == ["chk-4", "chk-5", "chk-6"]
    assert storage.retain(2) == []
    with pytest.raises(ValueError):
        storage.retain(0)


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
        CheckpointStorage.resolve(storage.checkpoint_dir(7))
