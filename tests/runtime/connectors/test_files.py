"""FileStreamSource: local and S3 (moto), bounded and unbounded, exact restore, bad input."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest

from runtime.connectors.files import FileStreamSource, SourceDataError, is_dead_letter
from runtime.errors import ConnectorError
from runtime.sources import SourceReader
from tests.conftest import FakeS3


def write_jsonl(path: Path, records: list[Any]) -> None:
    tmp = path.with_name("." + path.name)  # appear whole: write, then rename
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    os.replace(tmp, path)


def drain(reader: SourceReader, batch: int = 3) -> list[Any]:
    out: list[Any] = []
    while (got := reader.read_batch(batch)) is not None:
        out.extend(got)
    return out


def through_msgpack(state: Any) -> Any:
    return msgpack.unpackb(msgpack.packb(state), strict_map_key=False)


def readers(source: FileStreamSource, p: int) -> list[SourceReader]:
    return [source.create_reader(i, p) for i in range(p)]


def test_bounded_jsonl_split_over_subtasks_reads_each_record_once(tmp_path: Path) -> None:
    for f in range(6):
        write_jsonl(tmp_path / f"f{f}.jsonl", [{"f": f, "i": i} for i in range(5)])
    source = FileStreamSource(str(tmp_path))
    source.validate("files")
    parts = [drain(r) for r in readers(source, 2)]
    assert all(parts)  # both subtasks got files
    got = sorted((r["f"], r["i"]) for part in parts for r in part)
    assert got == [(f, i) for f in range(6) for i in range(5)]


def test_csv_and_parquet(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "a.csv").write_text('user,n\nann,1\n"b, c",2\n')
    assert drain(FileStreamSource(str(tmp_path / "*.csv"), "csv").create_reader(0, 1)) == [
        {"user": "ann", "n": "1"},
        {"user": "b, c", "n": "2"},
    ]
    pq.write_table(pa.table({"n": list(range(10))}), tmp_path / "a.parquet", row_group_size=4)
    reader = FileStreamSource(str(tmp_path / "*.parquet"), "parquet").create_reader(0, 1)
    assert drain(reader) == [{"n": i} for i in range(10)]


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_restore_mid_file_neither_skips_nor_repeats(tmp_path: Path, fmt: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    for f in range(3):
        rows = [{"f": f, "i": i} for i in range(7)]
        if fmt == "jsonl":
            write_jsonl(tmp_path / f"f{f}.jsonl", rows)
        elif fmt == "csv":
            body = "".join(f"{r['f']},{r['i']}\n" for r in rows)
            (tmp_path / f"f{f}.csv").write_text("f,i\n" + body)
        else:
            pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"f{f}.parquet", row_group_size=3)
    source = FileStreamSource(str(tmp_path / f"*.{fmt}"), fmt)
    reader = source.create_reader(0, 1)
    before = reader.read_batch(5)
    assert before is not None
    before += reader.read_batch(4) or []  # into the second file
    state = through_msgpack(reader.snapshot())
    drain(reader)  # read on, then crash
    fresh = source.create_reader(0, 1)
    fresh.restore(state)
    after = drain(fresh, batch=2)
    got = [(int(r["f"]), int(r["i"])) for r in before + after]
    assert got == [(f, i) for f in range(3) for i in range(7)]


def test_unbounded_picks_up_new_files(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [1, 2])
    reader = FileStreamSource(str(tmp_path), poll_interval_s=0.05).create_reader(0, 1)
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while len(got) < 2:
        got.extend(reader.read_batch(10) or [])
    assert reader.read_batch(10) == []  # nothing new: not the end
    write_jsonl(tmp_path / "b.jsonl", [3])
    while len(got) < 3 and time.monotonic() < deadline:
        got.extend(reader.read_batch(10) or [])
        time.sleep(0.01)
    assert got == [1, 2, 3]


def test_unbounded_ends_once_the_done_marker_is_there(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [1])
    source = FileStreamSource(str(tmp_path), poll_interval_s=0.01, done_marker="_SUCCESS")
    reader = source.create_reader(0, 1)
    assert reader.read_batch(10) == [1]
    assert reader.read_batch(10) == []
    write_jsonl(tmp_path / "b.jsonl", [2])
    (tmp_path / "_SUCCESS").write_text("")
    got: list[Any] = []
    deadline = time.monotonic() + 10
    while (batch := reader.read_batch(10)) is not None:
        got.extend(batch)
        assert time.monotonic() < deadline
    assert got == [2]


def test_malformed_line_fails_naming_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"ok": 1}\n{"broken\n')
    reader = FileStreamSource(str(tmp_path)).create_reader(0, 1)
    with pytest.raises(SourceDataError) as info:
        drain(reader)
    message = str(info.value)
    assert f"{tmp_path}/a.jsonl, line 2 malformed" in message
    assert "on_error='dead_letter'" in message


def test_dead_letter_mode_emits_the_bad_line(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"ok": 1}\n{"broken\n{"ok": 2}\n')
    got = drain(FileStreamSource(str(tmp_path), on_error="dead_letter").create_reader(0, 1))
    assert [r for r in got if not is_dead_letter(r)] == [{"ok": 1}, {"ok": 2}]
    (bad,) = [r["_dead_letter"] for r in got if is_dead_letter(r)]
    assert (bad["line"], bad["text"]) == (2, '{"broken')


def test_a_file_changed_after_it_was_read_is_reported(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [1])
    reader = FileStreamSource(str(tmp_path), poll_interval_s=0.01).create_reader(0, 1)
    assert reader.read_batch(10) == [1]
    with open(tmp_path / "a.jsonl", "a") as fh:
        fh.write("2\n")
    with pytest.raises(SourceDataError, match=r"a\.jsonl changed after it was read"):
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            reader.read_batch(10)


def test_missing_directory_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConnectorError, match=r"does not exist .* create it or fix the URL"):
        FileStreamSource(str(tmp_path / "nope")).validate("files")


def test_s3_files_and_a_missing_bucket(s3: FakeS3) -> None:
    import fsspec

    fs = fsspec.filesystem("s3", **s3.options)
    prefix = s3.url("stream-src")
    for f in range(3):
        fs.pipe(f"{prefix}/f{f}.jsonl", "".join(f"{f * 10 + i}\n" for i in range(4)).encode())
    source = FileStreamSource(prefix, storage_options=s3.options)
    source.validate("files")
    got = sorted(r for reader in readers(source, 2) for r in drain(reader))
    assert got == sorted(f * 10 + i for f in range(3) for i in range(4))
    started = time.monotonic()
    missing = FileStreamSource("s3://no-such-bucket/in", storage_options=s3.options)
    with pytest.raises(ConnectorError, match="s3://no-such-bucket/in does not exist"):
        missing.validate("files")
    assert time.monotonic() - started < 10
