"""LocalFileSystem: whole and streaming writes are all or nothing, parts are written in
place with one fsync and published by a whole write's directory fsync; storage URLs
choose the filesystem (fsspec for any scheme but file://)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from statebackend.errors import StateError
from statebackend.fs import LocalFileSystem, filesystem_for
from statebackend.fsspec_fs import FsspecFileSystem


def test_streaming_write_appears_only_when_closed(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    path = str(tmp_path / "a" / "b.bin")  # parents are created
    with fs.open_write(path) as out:
        out.write(b"part")
        assert not os.path.exists(path)
    assert fs.read_bytes(path) == b"part" and fs.size(path) == 4
    assert fs.list_dir(str(tmp_path / "a")) == ["b.bin"]
    assert fs.list_dirs(str(tmp_path)) == ["a"] and fs.list_dirs(str(tmp_path / "a")) == []


def test_a_failed_write_leaves_the_old_file(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    path = str(tmp_path / "meta")
    fs.write_whole(path, b"old")
    with pytest.raises(ValueError, match="boom"), fs.open_write(path) as out:
        out.write(b"new")
        raise ValueError("boom")
    assert fs.read_bytes(path) == b"old" and os.listdir(tmp_path) == ["meta"]


def fsyncs_recorded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths os.fsync is called on from now on (through /proc/self/fd)."""
    synced: list[str] = []
    real_fsync = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return synced


def test_a_part_is_written_in_place_with_one_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = LocalFileSystem()
    synced = fsyncs_recorded(monkeypatch)

    def no_rename(*args: object) -> None:
        raise AssertionError("a part is not renamed")

    monkeypatch.setattr(os, "replace", no_rename)
    path = str(tmp_path / "chk-1" / "t.state")  # parents are created
    with fs.open_write_part(path) as out:
        out.write(b"state")
        out.flush()
        assert os.listdir(tmp_path / "chk-1") == ["t.state"]  # in place, no temp file
    assert fs.read_bytes(path) == b"state"
    assert synced == [path]  # the file alone: its name is published with _metadata


def test_the_whole_write_that_publishes_parts_fsyncs_their_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fs = LocalFileSystem()
    directory = str(tmp_path / "chk-1")
    with fs.open_write_part(os.path.join(directory, "t.state")) as out:
        out.write(b"state")
    synced = fsyncs_recorded(monkeypatch)
    fs.write_whole(os.path.join(directory, "_metadata"), b"{}")
    assert synced == [os.path.join(directory, "_metadata.tmp"), directory]
    assert sorted(os.listdir(directory)) == ["_metadata", "t.state"]


def test_a_failed_part_leaves_nothing(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    path = str(tmp_path / "t.state")
    with pytest.raises(ValueError, match="boom"), fs.open_write_part(path) as out:
        out.write(b"half")
        raise ValueError("boom")
    assert os.listdir(tmp_path) == []


def test_remove_is_quiet(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    fs.remove(str(tmp_path / "missing"))
    fs.remove_tree(str(tmp_path / "missing"))
    assert not fs.exists(str(tmp_path / "missing")) and fs.is_dir(str(tmp_path))


def test_storage_urls(tmp_path: Path) -> None:
    fs, root = filesystem_for(f"file://{tmp_path}")
    assert isinstance(fs, LocalFileSystem) and root == str(tmp_path)
    assert filesystem_for("relative/dir")[1] == os.path.abspath("relative/dir")
    fs, root = filesystem_for("memory://bucket/chk/", {"skip_instance_cache": True})
    assert isinstance(fs, FsspecFileSystem) and root == "memory://bucket/chk"
    with pytest.raises(StateError, match="does not know the nosuch:// scheme"):
        filesystem_for("nosuch://bucket/chk")  # at once
    gcs, root = filesystem_for("gcs://bucket/chk")  # gcsfs is not installed: on first use
    with pytest.raises(StateError, match="'gcs://bucket/chk' needs the fsspec implementation"):
        gcs.exists(root)
