"""Chain files of incremental checkpoints on disk (statebackend/shared.py): writing and
reading them, and `SharedStateRegistry`'s reference counting that deletes a file only when
no retained checkpoint refers to it (with the companion showing naive deletion breaks one)."""

from __future__ import annotations

import zlib
from pathlib import Path

import msgpack
import pytest

from statebackend.errors import CorruptCheckpointError
from statebackend.incremental import StateRef
from statebackend.metadata import CheckpointMetadata, OperatorLayout, TaskStateHandle
from statebackend.metrics import CheckpointSummary
from statebackend.shared import SharedStateRegistry, read_chain_blob, write_chain_file
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import CheckpointStorage

GROUPS = 8


def chained_checkpoint(storage: CheckpointStorage, n: int, files: list[str]) -> CheckpointMetadata:
    """Write chain files ``files`` (those not yet there) and checkpoint ``n`` naming them."""
    refs = []
    for path in files:
        full = Path(storage.root, path)
        if not full.exists():
            blob = msgpack.packb([1, [["value", "value", {path: n}]]])
            write_chain_file(storage, path, {"sum": OperatorSnapshot(None, blob, range(GROUPS))})
        data = full.read_bytes()
        refs.append(
            StateRef(path, len(data), zlib.crc32(data), path == files[0], (0, GROUPS), (0, GROUPS))
        )
    handle = TaskStateHandle(
        "", 0, 0, {"sum": OperatorLayout(0, 1, (0, GROUPS))}, None, {"sum": tuple(refs)}
    )
    inline = storage.inline_handle({}, {"sum": OperatorLayout(0, 1, (0, GROUPS))})
    assert inline is not None
    handle = TaskStateHandle(
        inline.file, inline.size, inline.crc32, handle.operators, inline.inline, handle.chains
    )
    metadata = CheckpointMetadata(
        n, "job", 0, False, 1.0, 2.0, 1.0, GROUPS, {"sum[0]": handle}, {}, CheckpointSummary()
    )
    storage.write_metadata(metadata)
    return metadata


def run_retention(tmp_path: Path, naive: bool) -> CheckpointStorage:
    """Checkpoints 1-4 with chains that share files (4's base is a compaction of 1-3's);
    retention keeps 2. ``naive``: delete every chain file a deleted checkpoint named."""
    storage = CheckpointStorage(str(tmp_path / "chk"), inline_threshold=1 << 16)
    registry = SharedStateRegistry(storage)
    chains = {
        1: ["shared/t/1-b.state"],
        2: ["shared/t/1-b.state", "shared/t/2-d.state"],
        3: ["shared/t/1-b.state", "shared/t/2-d.state", "shared/t/3-d.state"],
        4: ["shared/t/0-merged.state", "shared/t/4-d.state"],
    }
    for n, files in chains.items():
        registry.register(chained_checkpoint(storage, n, files))
        deleted = storage.retain(2)
        if naive:
            for gone in deleted:
                for path in chains[gone]:
                    storage.fs.remove(str(Path(storage.root, path)))
        else:
            registry.release(deleted)
    return storage


def test_retention_deletes_a_chain_file_only_when_no_retained_checkpoint_refers_to_it(
    tmp_path: Path,
) -> None:
    storage = run_retention(tmp_path, naive=False)
    assert storage.completed_checkpoints() == [3, 4]
    for n in (3, 4):
        storage.check(n)  # every chain file is there and intact
    left = sorted(p.name for p in Path(storage.root, "shared", "t").iterdir())
    assert left == ["0-merged.state", "1-b.state", "2-d.state", "3-d.state", "4-d.state"]


def test_the_naive_deletion_companion_breaks_a_retained_checkpoint(tmp_path: Path) -> None:
    storage = run_retention(tmp_path, naive=True)
    with pytest.raises(CorruptCheckpointError, match=r"chain file .* is missing"):
        storage.check(3)


def test_orphans_go_between_attempts_and_referenced_files_stay(tmp_path: Path) -> None:
    storage = run_retention(tmp_path, naive=False)
    orphan = Path(storage.root, "shared", "t", "9-0-chk-dead.state")
    orphan.write_bytes(b"ABSF-partial")
    removed = SharedStateRegistry(storage).remove_orphans()
    assert removed == ["shared/t/9-0-chk-dead.state"]
    storage.check(3)
    storage.check(4)


def test_a_corrupt_or_missing_chain_file_makes_restore_fall_back(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "chk"), inline_threshold=1 << 16)
    chained_checkpoint(storage, 1, ["shared/t/1-b.state"])
    chained_checkpoint(storage, 2, ["shared/t/1-b.state", "shared/t/2-d.state"])
    delta = Path(storage.root, "shared", "t", "2-d.state")
    data = bytearray(delta.read_bytes())
    data[-1] ^= 0xFF
    delta.write_bytes(bytes(data))
    found = storage.latest_valid()
    assert found is not None and found[0] == 1
    delta.unlink()
    with pytest.raises(CorruptCheckpointError, match="is missing"):
        storage.check(2, verify_files=False)
    blob = read_chain_blob(storage, storage.check(1).tasks["sum[0]"].chains["sum"][0], "sum")
    assert msgpack.unpackb(blob) == [1, [["value", "value", {"shared/t/1-b.state": 1}]]]


def test_registering_a_checkpoint_again_does_not_count_its_files_twice(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "chk"), inline_threshold=1 << 16)
    registry = SharedStateRegistry(storage)
    first = chained_checkpoint(storage, 1, ["shared/t/1-b.state"])
    registry.register(first)
    registry.register(first)
    registry.register(chained_checkpoint(storage, 2, ["shared/t/1-b.state", "shared/t/2-d.state"]))
    assert registry.release([1]) == []  # 2 still refers to 1-b
    assert registry.referenced() == {"shared/t/1-b.state", "shared/t/2-d.state"}
    assert registry.release([2]) == ["shared/t/1-b.state", "shared/t/2-d.state"]
    assert registry.referenced() == set()
    assert not Path(storage.root, "shared", "t", "1-b.state").exists()


def test_load_counts_the_completed_checkpoints_and_skips_unreadable_ones(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "chk"), inline_threshold=1 << 16)
    chained_checkpoint(storage, 1, ["shared/t/1-b.state"])
    chained_checkpoint(storage, 2, ["shared/t/1-b.state", "shared/t/2-d.state"])
    metadata = next(Path(storage.root).glob("chk-2/_metadata"))
    metadata.write_bytes(b"not metadata")
    registry = SharedStateRegistry(storage)
    registry.load()
    assert registry.referenced() == {"shared/t/1-b.state"}


def test_no_shared_directory_has_no_orphans(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path / "chk"), inline_threshold=1 << 16)
    assert SharedStateRegistry(storage).remove_orphans() == []
