import collections
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from statebackend import (
    FLAG_RAW,
    CorruptStateError,
    KeyedStateBackend,
    OperatorSnapshot,
    list_operators,
    read_keyed_state,
    read_operator_state,
    verify_state_file,
    write_task_snapshot,
)
from tests.statebackend.keygroups import MAX_PARALLELISM, crc32_key_group_of, key_group_range

KG = crc32_key_group_of()


def keyed_backend(n: int, groups: range) -> KeyedStateBackend:
    b = KeyedStateBackend("count", MAX_PARALLELISM, groups, KG)
    values = b.value_state()
    for i in range(n):
        if KG(i) in groups:
            values[i] = i * 31
    return b


FORMS = pytest.mark.parametrize("compress", [False, True], ids=["raw", "lz4"])


def write_sample(path: str, compress: bool = False) -> tuple[KeyedStateBackend, int]:
    groups = key_group_range(1, 4)
    b = keyed_backend(2000, groups)
    info = write_task_snapshot(
        path,
        {
            "source": OperatorSnapshot(msgpack.packb({"offset": 42}), None, None),
            "count": OperatorSnapshot(msgpack.packb([1, 2]), b.snapshot(), groups),
            "sink": OperatorSnapshot(None, None, None),
        },
        {"count": KG},
        compress,
    )
    assert info.path == path and info.size == os.path.getsize(path)
    return b, info.crc32


@FORMS
def test_round_trip(tmp_path: Path, compress: bool) -> None:
    path = os.path.join(str(tmp_path), "count[1].state")
    src, crc = write_sample(path, compress)
    verify_state_file(path, crc)
    assert msgpack.unpackb(read_operator_state(path, "source")) == {"offset": 42}
    assert read_operator_state(path, "sink") is None
    assert read_operator_state(path, "nope") is None
    assert list_operators(path) == {
        "source": {"keyed": False, "key_groups": None},
        "count": {"keyed": True, "key_groups": [32, 63]},
        "sink": {"keyed": False, "key_groups": None},
    }
    blobs = read_keyed_state(path, "count", range(MAX_PARALLELISM))
    dst = KeyedStateBackend("count", MAX_PARALLELISM, range(MAX_PARALLELISM), KG)
    dst.restore(blobs)
    assert dst.value_state() == src.value_state()
    # a narrower request returns only those key groups
    some = read_keyed_state(path, "count", range(32, 40))
    part = KeyedStateBackend("count", MAX_PARALLELISM, range(MAX_PARALLELISM), KG)
    part.restore(some)
    assert part.value_state() == {k: v for k, v in src.value_state().items() if KG(k) < 40}
    assert 0 < part.num_keys() < src.num_keys()


def test_info_crc_is_the_file_crc(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "t.state")
    _, crc = write_sample(path)
    with pytest.raises(CorruptStateError, match="file crc32"):
        verify_state_file(path, crc ^ 1)


@FORMS
def test_flipped_byte_in_a_section_is_detected(tmp_path: Path, compress: bool) -> None:
    path = os.path.join(str(tmp_path), "count[1].state")
    write_sample(path, compress)
    data = bytearray(Path(path).read_bytes())
    data[-10] ^= 0x40  # inside the last section
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="crc32 mismatch in section") as err:
        verify_state_file(path)
    assert err.value.path == path and path in str(err.value)
    with pytest.raises(CorruptStateError, match="crc32 mismatch in section 'count'"):
        read_keyed_state(path, "count", range(MAX_PARALLELISM))


def test_flipped_byte_in_header_is_detected(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "t.state")
    write_sample(path)
    data = bytearray(Path(path).read_bytes())
    data[25] ^= 0x01
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptStateError, match="header crc32 mismatch"):
        read_operator_state(path, "source")


@FORMS
@pytest.mark.parametrize("keep", [10, 100, -5])
def test_truncated_file_is_detected(tmp_path: Path, keep: int, compress: bool) -> None:
    path = os.path.join(str(tmp_path), "t.state")
    write_sample(path, compress)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:keep])
    with pytest.raises(CorruptStateError, match="truncated") as err:
        verify_state_file(path)
    assert path in str(err.value)


def test_bad_magic(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "t.state")
    Path(path).write_bytes(b"NOTSTATE" + bytes(40))
    with pytest.raises(CorruptStateError, match="bad magic"):
        list_operators(path)


def test_trailing_bytes_are_detected(tmp_path: Path) -> None:
    path = os.path.join(str(tmp_path), "t.state")
    write_sample(path)
    with open(path, "ab") as f:
        f.write(b"x")
    with pytest.raises(CorruptStateError, match="trailing"):
        verify_state_file(path)


PREFIX = struct.Struct(">8sHHII")  # the file's prefix, as the module docstring gives it


def prefix_and_header(path: str) -> tuple[tuple[bytes, int, int, int, int], dict[str, Any], bytes]:
    data = Path(path).read_bytes()
    fields = PREFIX.unpack_from(data)
    header = msgpack.unpackb(data[PREFIX.size : PREFIX.size + fields[3]])
    return fields, header, data[PREFIX.size + fields[3] :]


def test_the_two_forms_hold_the_same_blobs_raw_or_as_lz4_blocks(tmp_path: Path) -> None:
    blob = msgpack.packb([("word", i) for i in range(5000)])  # compressible, as records are
    snap = {"sink": OperatorSnapshot(blob, None, None)}
    raw, lz4 = str(tmp_path / "raw.state"), str(tmp_path / "lz4.state")
    write_task_snapshot(raw, snap)  # the default: raw, as tasks write unless told
    write_task_snapshot(lz4, snap, compress=True)
    (_, _, raw_flags, _, _), raw_header, raw_data = prefix_and_header(raw)
    (_, _, lz4_flags, _, _), _, lz4_data = prefix_and_header(lz4)
    assert raw_flags == FLAG_RAW and lz4_flags == 0
    assert raw_data == blob  # the section is the blob itself
    [[length, crc, raw_length]] = [section[4:] for section in raw_header["sections"]]
    assert length == raw_length == len(blob) and crc == zlib.crc32(blob)
    assert len(lz4_data) < len(blob) // 2
    assert read_operator_state(raw, "sink") == read_operator_state(lz4, "sink") == blob
    verify_state_file(raw)
    verify_state_file(lz4)


def rewrite(path: str, flags: int | None = None, raw_length: int | None = None) -> None:
    """Rewrite a state file's prefix flags or its first section's raw length (the header
    crc recomputed: only the field differs)."""
    (magic, version, old_flags, _, _), header, data = prefix_and_header(path)
    if raw_length is not None:
        header["sections"][0][6] = raw_length
    packed = msgpack.packb(header)
    prefix = PREFIX.pack(
        magic, version, old_flags if flags is None else flags, len(packed), zlib.crc32(packed)
    )
    Path(path).write_bytes(prefix + packed + data)


@pytest.mark.parametrize("flags", [0x0002, 0x8001])
def test_unknown_flags_are_refused(tmp_path: Path, flags: int) -> None:
    path = str(tmp_path / "t.state")
    write_sample(path)
    rewrite(path, flags=flags)
    with pytest.raises(CorruptStateError, match="unknown flags") as err:
        read_operator_state(path, "source")
    assert path in str(err.value)


def test_a_raw_section_of_another_length_than_its_header_says_is_refused(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "t.state")
    write_sample(path)
    rewrite(path, raw_length=3)
    with pytest.raises(CorruptStateError, match="says it holds 3 bytes"):
        read_operator_state(path, "source")
    # An lz4 file's raw length is what its blocks decompress to (their stored size).
    write_sample(path, compress=True)
    rewrite(path, raw_length=3)
    assert msgpack.unpackb(read_operator_state(path, "source")) == {"offset": 42}


def test_keyed_state_without_key_group_fn_is_one_whole_range_section(tmp_path: Path) -> None:
    src = keyed_backend(200, range(0, 64))
    path = os.path.join(str(tmp_path), "t.state")
    write_task_snapshot(path, {"count": OperatorSnapshot(None, src.snapshot(), range(0, 64))})
    verify_state_file(path)
    assert len(read_keyed_state(path, "count", range(64, 128))) == 0  # no overlap: nothing read
    blobs = read_keyed_state(path, "count", range(32, 96))
    assert len(blobs) == 1
    dst = keyed_backend(0, range(32, 96))
    dst.restore(blobs)  # the restore keeps only keys of key groups 32..95
    expected = {k: v for k, v in src.value_state().items() if KG(k) in range(32, 64)}
    assert dst.value_state() == expected and expected


def test_final_path_never_holds_a_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the writer is blocked inside fsync, only the .tmp file exists."""
    path = os.path.join(str(tmp_path), "t.state")
    in_fsync, release = threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd: int) -> None:
        in_fsync.set()
        release.wait(5)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    writer = threading.Thread(target=write_sample, args=(path,))
    writer.start()
    assert in_fsync.wait(5)
    assert not os.path.exists(path) and os.path.exists(path + ".tmp")
    release.set()
    writer.join(5)
    assert os.path.exists(path) and not os.path.exists(path + ".tmp")
    verify_state_file(path)


def test_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = os.path.join(str(tmp_path), "t.state")

    def failing_fsync(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="disk full"):
        write_sample(path)
    assert os.listdir(str(tmp_path)) == []


def test_write_10k_keys_regroups_them_in_one_pass(tmp_path: Path) -> None:
    """The writer's key-group split is linear: it asks the key group of each key once
    (no pass over the keys per key group), and each key lands in its own group's section
    (what a restore of a narrower range relies on)."""
    b = keyed_backend(10_000, range(MAX_PARALLELISM))
    assert b.num_keys() == 10_000
    asked: collections.Counter[Any] = collections.Counter()

    def counting_key_group(key: Any) -> int:
        asked[key] += 1
        return KG(key)

    path = os.path.join(str(tmp_path), "t.state")
    info = write_task_snapshot(
        path,
        {"count": OperatorSnapshot(None, b.snapshot(), range(MAX_PARALLELISM))},
        {"count": counting_key_group},
    )
    assert info.sections == MAX_PARALLELISM
    assert len(asked) == 10_000 and set(asked.values()) == {1}
    restored = 0
    for kg in range(MAX_PARALLELISM):
        (blob,) = read_keyed_state(path, "count", range(kg, kg + 1))
        dst = KeyedStateBackend("count", MAX_PARALLELISM, range(MAX_PARALLELISM), KG)
        dst.restore([blob])
        keys = dict(dst.value_state())
        assert keys and {KG(k) for k in keys} == {kg}
        assert all(v == k * 31 for k, v in keys.items())
        restored += len(keys)
    assert restored == 10_000
