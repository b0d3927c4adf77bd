"""Source readers (runtime/sources.py), driven by hand: partitioning over subtasks, exact
resume from a snapshot, the text-file reader's splits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import pytest

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


def test_text_file_reader_reports_its_splits(tmp_path: Path) -> None:
    from runtime.sources import TextFileSource

    for i in range(2):
        (tmp_path / f"f{i}.txt").write_text("".join(f"line{j}\n" for j in range(5)))
    reader = TextFileSource(str(tmp_path / "*.txt")).create_reader(0, 1)
    seen = []
    while (batch := reader.read_batch(3)) is not None:
        if batch:
            seen.append((reader.current_split(), len(batch), reader.take_ended_splits()))
    assert seen == [(0, 3, []), (0, 2, [0]), (1, 3, []), (1, 2, [1])]
