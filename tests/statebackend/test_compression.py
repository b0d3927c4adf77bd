"""Task state files raw or lz4-compressed (``JobConfig.snapshot_compression``): what the
storage writes for each setting, and that either reads the other's checkpoints."""

from pathlib import Path

import msgpack
import pytest

from runtime.config import JobConfig
from runtime.errors import GraphError
from statebackend import FLAG_RAW, CheckpointStorage, KeyedStateBackend
from tests.statebackend.test_inline_state import LAYOUT, snapshots, write
from tests.statebackend.test_snapshot import PREFIX


def flags_of(storage: CheckpointStorage, n: int) -> int:
    [path] = Path(storage.root, f"chk-{n}").glob("*.state")
    return int(PREFIX.unpack_from(path.read_bytes())[2])


def read_back(storage: CheckpointStorage, n: int) -> tuple[object, dict[object, object]]:
    handle = storage.check(n).tasks["t[0]"]
    source = msgpack.unpackb(storage.read_operator_state(n, handle, "src"))
    keyed = KeyedStateBackend("count", 128, range(0, 64), lambda key: hash(key) % 64)
    keyed.restore(storage.read_keyed_state(n, handle, "count", range(0, 64)))
    return source, keyed.value_state()


def test_files_are_raw_by_default_and_lz4_when_asked_and_either_reads_the_other(
    tmp_path: Path,
) -> None:
    raw = CheckpointStorage(str(tmp_path))
    lz4 = CheckpointStorage(str(tmp_path), compression=True)
    write(raw, 1, 3000)
    write(lz4, 2, 3000)
    assert flags_of(raw, 1) == FLAG_RAW and flags_of(lz4, 2) == 0
    expected = ({"offset": 3000}, {f"w{i}": i for i in range(3000)})
    for reader in (raw, lz4):  # a job restores whichever form its checkpoint has
        assert read_back(reader, 1) == read_back(reader, 2) == expected


def test_inline_states_take_the_setting_too(tmp_path: Path) -> None:
    small = snapshots(50)
    raw = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024)
    lz4 = CheckpointStorage(str(tmp_path), inline_threshold=20 * 1024, compression=True)
    raw_inline, lz4_inline = raw.inline_handle(small, LAYOUT), lz4.inline_handle(small, LAYOUT)
    assert raw_inline is not None and lz4_inline is not None
    assert raw_inline.inline is not None and lz4_inline.inline is not None
    assert PREFIX.unpack_from(raw_inline.inline)[2] == FLAG_RAW
    assert PREFIX.unpack_from(lz4_inline.inline)[2] == 0


@pytest.mark.parametrize("bad", [1, "lz4", None])
def test_the_setting_is_a_bool(bad: object) -> None:
    with pytest.raises(GraphError, match="snapshot_compression must be True"):
        JobConfig(snapshot_compression=bad)  # type: ignore[arg-type]
