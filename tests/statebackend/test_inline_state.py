"""Small task states held inline in the ack and ``_metadata`` (Flink's memory threshold)."""

import base64
import json
import os
import zlib
from pathlib import Path

import msgpack
import pytest

from runtime.config import JobConfig
from runtime.errors import GraphError
from statebackend import (
    CheckpointStatus,
    CheckpointStorage,
    CorruptCheckpointError,
    OperatorLayout,
    OperatorSnapshot,
    TaskStateHandle,
)
from statebackend.keyed import KeyedStateBackend
from tests.statebackend.test_storage import metadata_of

KEY_GROUPS = range(0, 64)


def backend() -> KeyedStateBackend:
    return KeyedStateBackend("count", 128, KEY_GROUPS, lambda key: hash(key) % 64)


def snapshots(n_keys: int) -> dict[str, OperatorSnapshot]:
    keyed = backend()
    counts = keyed.value_state()
    for i in range(n_keys):
        counts[f"w{i}"] = i
    return {
        "src": OperatorSnapshot(msgpack.packb({"offset": n_keys}), None, None),
        "count": OperatorSnapshot(None, keyed.snapshot(), KEY_GROUPS),
    }


LAYOUT = {"src": OperatorLayout(0, 2), "count": OperatorLayout(0, 2, (0, 64))}


def write(storage: CheckpointStorage, n: int, n_keys: int) -> TaskStateHandle:
    handle = storage.write_task_state(n, "t[0]", snapshots(n_keys), LAYOUT)
    storage.write_metadata(metadata_of(n, {"t[0]": handle}))
    return handle


def test_a_state_under_the_threshold_is_inline_and_reads_like_a_file(tmp_path: Path) -> None:
    files = CheckpointStorage(str(tmp_path / "files"))  # threshold 0: always a file
    inline = CheckpointStorage(str(tmp_path / "inline"), inline_threshold=20 * 1024)
    on_disk, held = write(files, 1, 50), write(inline, 1, 50)
    assert on_disk.inline is None and os.path.exists(files.task_state_path(1, "t[0]"))
    assert held.inline is not None and held.file == "" and held.describe() == "inline"
    assert not os.path.exists(inline.task_state_path(1, "t[0]"))
    assert os.listdir(inline.location(1)) == ["_metadata"]  # no state file at all
    # The same bytes as the file, read back through the verified metadata.
    assert held.inline == Path(files.task_state_path(1, "t[0]")).read_bytes()
    assert (held.size, held.crc32) == (on_disk.size, on_disk.crc32)
    meta = inline.check(1)
    assert meta.tasks["t[0]"] == held
    for storage, handle in ((files, on_disk), (inline, meta.tasks["t[0]"])):
        assert msgpack.unpackb(storage.read_operator_state(1, handle, "src")) == {"offset": 50}
        blobs = storage.read_keyed_state(1, handle, "count", KEY_GROUPS)
        restored = backend()
        restored.restore(blobs)
        assert dict(restored.value_state().items()) == {f"w{i}": i for i in range(50)}


def test_a_state_over_the_threshold_is_a_file(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), inline_threshold=512)
    handle = write(storage, 1, 2000)
    assert handle.size > 512 and handle.inline is None and handle.file == "t[0].state"
    assert os.path.getsize(storage.task_state_path(1, "t[0]")) == handle.size
    assert storage.check(1).tasks["t[0]"] == handle


def test_the_handle_crosses_the_control_plane_and_the_json_metadata(tmp_path: Path) -> None:
    storage = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024)
    handle = write(storage, 1, 10)
    packed = msgpack.unpackb(msgpack.packb(handle.encode(), use_bin_type=True), raw=False)
    assert TaskStateHandle.decode(packed) == handle
    text = (tmp_path / "chk-1" / "_metadata").read_text()
    stored = json.loads(text)["tasks"]["t[0]"]
    assert base64.b64decode(stored["inline"]) == handle.inline


def _tamper(tmp_path: Path, change: dict[str, object]) -> None:
    """Edit the inline entry of t[0] in chk-1/_metadata and re-seal its checksum, so that
    only the inline state itself is wrong (a hand-edited or badly copied checkpoint)."""
    path = tmp_path / "chk-1" / "_metadata"
    body = json.loads(path.read_text())
    body["tasks"]["t[0]"].update(change)
    body.pop("crc32")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    body["crc32"] = zlib.crc32(canonical)
    path.write_text(json.dumps(body))


@pytest.mark.parametrize("what", ["flipped byte", "truncated", "not base64"])
def test_a_corrupt_inline_state_fails_the_check_and_names_the_task(
    tmp_path: Path, what: str
) -> None:
    storage = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024)
    handle = write(storage, 1, 10)
    data = bytearray(handle.inline or b"")
    if what == "flipped byte":
        data[-1] ^= 0xFF
        change: dict[str, object] = {"inline": base64.b64encode(bytes(data)).decode()}
    elif what == "truncated":
        change = {"inline": base64.b64encode(bytes(data[:-3])).decode()}
    else:
        change = {"inline": "not base64 at all!"}
    _tamper(tmp_path, change)
    with pytest.raises(CorruptCheckpointError) as err:
        storage.check(1)
    assert "t[0]" in str(err.value)
    if what != "not base64":
        assert "inline state" in str(err.value)
    assert storage.status(1).status is CheckpointStatus.CORRUPT
    assert storage.latest_valid() is None  # nothing restores from it


@pytest.mark.parametrize("bad", [-1, 1.5, "20k", True])
def test_the_threshold_must_be_a_byte_count(bad: object) -> None:
    with pytest.raises(GraphError, match="state_inline_threshold must be an int >= 0"):
        JobConfig(state_inline_threshold=bad)  # type: ignore[arg-type]


def test_inline_handle_encodes_on_the_callers_thread_only_what_is_small_before_compression(
    tmp_path: Path,
) -> None:
    storage = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024)
    small = snapshots(50)
    # The same handle as the writer thread's, bytes and checksum included.
    assert storage.inline_handle(small, LAYOUT) == storage.write_task_state(
        1, "t[0]", small, LAYOUT
    )
    # Over the threshold before compression: left to the writer thread, which may still
    # hold it inline once compressed, or write a file.
    big = snapshots(5000)
    raw = sum(len(s.operator_state or b"") + len(s.keyed_state or b"") for s in big.values())
    assert raw > 20 * 1024 and storage.inline_handle(big, LAYOUT) is None
    # Just under the threshold: the file's header pushes it over.
    noise = {"src": OperatorSnapshot(os.urandom(20 * 1024 - 8), None, None)}
    assert storage.inline_handle(noise, {"src": OperatorLayout(0, 2)}) is None
    assert CheckpointStorage(str(tmp_path)).inline_handle(small, LAYOUT) is None  # threshold 0
