"""FsspecFileSystem against fsspec's memory:// and a fake S3 (moto on loopback): whole
writes, streaming writes visible only after a successful close, nothing left by a
failed one, listing, recursive removal, and CheckpointStorage on top."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgpack
import pytest

from statebackend.errors import (
    CheckpointNotFoundError,
    CorruptCheckpointError,
    StateError,
    StorageAccessError,
)
from statebackend.fs import filesystem_for
from statebackend.fsspec_fs import FsspecFileSystem
from statebackend.metadata import CheckpointMetadata, OperatorLayout
from statebackend.metrics import CheckpointSummary
from statebackend.snapshot import OperatorSnapshot
from statebackend.storage import METADATA, CheckpointStatus, CheckpointStorage
from tests.conftest import FakeS3

MiB = 1024 * 1024


@dataclass
class Remote:
    fs: FsspecFileSystem
    root: str
    options: dict[str, object]


@pytest.fixture(params=["memory", "s3"])
def remote(request: pytest.FixtureRequest) -> Iterator[Remote]:
    if request.param == "memory":
        root, options = f"memory://absflow-{uuid.uuid4().hex[:8]}", {}
    else:
        s3: FakeS3 = request.getfixturevalue("s3")
        root, options = request.getfixturevalue("s3_root"), s3.options
    fs, root = filesystem_for(root, options)
    assert isinstance(fs, FsspecFileSystem)
    yield Remote(fs, root, options)
    fs.remove_tree(root)


def test_urls_choose_the_filesystem(remote: Remote) -> None:
    assert remote.root.startswith(("memory://", "s3://"))
    assert remote.fs.streaming == remote.root.startswith("s3://")  # memory is spooled
    assert remote.fs.join(remote.root + "/", "chk-1", "_metadata") == (
        f"{remote.root}/chk-1/_metadata"
    )
    with pytest.raises(StateError, match="does not know the nosuch:// scheme"):
        filesystem_for("nosuch://x/y")


def test_whole_write(remote: Remote) -> None:
    fs, path = remote.fs, remote.fs.join(remote.root, "a", "b")
    fs.write_whole(path, b"hello")  # no parent needs creating
    assert fs.read_bytes(path) == b"hello" and fs.size(path) == 5 and fs.exists(path)
    assert fs.list_dir(remote.root) == ["a"] and fs.is_dir(fs.join(remote.root, "a"))
    fs.write_whole(path, b"new")  # replaces it whole
    assert fs.read_bytes(path) == b"new"


@pytest.mark.parametrize("method", ["open_write", "open_write_part"])
def test_streaming_write_is_visible_only_after_a_successful_close(
    remote: Remote, method: str
) -> None:
    fs, path = remote.fs, remote.fs.join(remote.root, "chk-1", "t.state")
    with getattr(fs, method)(path) as out:
        out.write(b"part one, ")
        out.write(b"part two")
        assert not fs.exists(path)
        assert not fs.exists(fs.join(remote.root, "chk-1"))
    assert fs.read_bytes(path) == b"part one, part two"
    with fs.open_read(path) as f:
        f.seek(5)
        assert f.read(3) == b"one"


@pytest.mark.parametrize("method", ["open_write", "open_write_part"])
def test_an_error_inside_the_block_leaves_nothing(remote: Remote, method: str) -> None:
    fs, path = remote.fs, remote.fs.join(remote.root, "chk-2", "t.state")
    with pytest.raises(ValueError, match="boom"), getattr(fs, method)(path) as out:
        out.write(b"x" * 1000)
        raise ValueError("boom")
    out.close()  # what the garbage collector does to an abandoned writer: no commit either
    gc.collect()
    assert not fs.exists(path) and not fs.is_dir(fs.join(remote.root, "chk-2"))
    with pytest.raises(FileNotFoundError, match="chk-2"):
        fs.read_bytes(path)


def test_listing_and_recursive_removal(remote: Remote) -> None:
    fs, root = remote.fs, remote.root
    for name in ("chk-1/a.state", "chk-1/_metadata", "chk-1/deep/x", "chk-2/b.state"):
        fs.write_whole(fs.join(root, name), b"1")
    assert sorted(fs.list_dir(root)) == ["chk-1", "chk-2"]
    assert sorted(fs.list_dir(fs.join(root, "chk-1"))) == ["_metadata", "a.state", "deep"]
    assert fs.list_dirs(fs.join(root, "chk-1")) == ["deep"]
    assert fs.is_dir(fs.join(root, "chk-1")) and not fs.is_dir(fs.join(root, "chk-1/a.state"))
    fs.remove_tree(fs.join(root, "chk-1"))
    assert fs.list_dir(root) == ["chk-2"] and not fs.exists(fs.join(root, "chk-1/deep/x"))
    fs.remove(fs.join(root, "chk-2/b.state"))
    fs.remove(fs.join(root, "chk-2/b.state"))  # a missing file is fine
    fs.remove_tree(fs.join(root, "chk-9"))  # so is a missing prefix
    with pytest.raises(FileNotFoundError):
        fs.list_dir(fs.join(root, "chk-9"))
    with pytest.raises(FileNotFoundError):
        fs.size(fs.join(root, "chk-9", "x"))


# -- S3 only: the multipart path, and errors -------------------------------------------------
def small_parts(s3: FakeS3) -> FsspecFileSystem:
    """s3fs with 5 MiB parts (the S3 minimum): 12 MiB is a multipart upload."""
    return FsspecFileSystem.for_url("s3://x", {**s3.options, "default_block_size": 5 * MiB})


def open_uploads(s3: FakeS3) -> list[str]:
    listed = s3.client().list_multipart_uploads(Bucket=s3.bucket)
    return [u["Key"] for u in listed.get("Uploads", [])]


def test_a_big_state_file_is_a_multipart_upload_completed_on_close(
    s3: FakeS3, s3_root: str
) -> None:
    fs, path = small_parts(s3), f"{s3_root}/chk-1/big.state"
    with fs.open_write(path) as out:
        for i in range(12):
            out.write(bytes([i]) * MiB)
        assert open_uploads(s3) == [path.removeprefix(f"s3://{s3.bucket}/")]  # parts went up
        assert not fs.exists(path)
    assert fs.size(path) == 12 * MiB and open_uploads(s3) == []
    with fs.open_read(path) as f:
        f.seek(11 * MiB)
        assert f.read(2) == bytes([11, 11])
    fs.remove_tree(s3_root)


def test_a_failed_multipart_upload_is_aborted(s3: FakeS3, s3_root: str) -> None:
    fs, path = small_parts(s3), f"{s3_root}/chk-1/big.state"
    with pytest.raises(RuntimeError, match="killed"), fs.open_write(path) as out:
        out.write(b"y" * 11 * MiB)
        assert open_uploads(s3) != []
        raise RuntimeError("killed")
    gc.collect()
    assert open_uploads(s3) == [] and not fs.exists(path)


def test_a_plain_s3fs_writer_would_publish_a_failed_write(s3: FakeS3, s3_root: str) -> None:
    """Why open_write discards: s3fs's own writer, left by an error, commits on close."""
    fs = FsspecFileSystem.for_url(s3_root, s3.options)
    path = f"{s3_root}/half.state"
    with pytest.raises(ValueError), fs.fs.open(path, "wb") as out:
        out.write(b"half")
        raise ValueError("the block failed")
    assert fs.read_bytes(path) == b"half"  # a half-written object, as if complete
    fs.remove_tree(s3_root)


def test_a_missing_bucket_names_the_url(s3: FakeS3) -> None:
    fs = FsspecFileSystem.for_url("s3://no-such-bucket", s3.options)
    url = "s3://no-such-bucket/chk/chk-1/_metadata"
    with pytest.raises(
        StorageAccessError, match=r"s3://no-such-bucket/chk/chk-1/_metadata.*bucket"
    ):
        fs.write_whole(url, b"{}")
    with pytest.raises(StorageAccessError, match="no-such-bucket"), fs.open_write(url) as out:
        out.write(b"1")


def test_a_refusing_endpoint_is_a_storage_access_error(s3: FakeS3) -> None:
    options = {**s3.options, "endpoint_url": "http://127.0.0.1:9"}  # discard port: refused
    options["config_kwargs"] = {"retries": {"max_attempts": 1}, "connect_timeout": 2}
    fs = FsspecFileSystem.for_url("s3://b", options)
    with pytest.raises(StorageAccessError, match=r"cannot write 's3://b/x'.*EndpointConnection"):
        fs.write_whole("s3://b/x", b"1")


# -- CheckpointStorage on top ------------------------------------------------------------------
def write_checkpoint(storage: CheckpointStorage, n: int, metadata: bool = True) -> None:
    snap = OperatorSnapshot(msgpack.packb(n), None, None)
    handle = storage.write_task_state(n, "src[0]", {"src": snap}, {"src": OperatorLayout(0, 1)})
    if metadata:
        storage.write_metadata(
            CheckpointMetadata(
                n, "job", 0, False, 1.0, 2.0, 1.0, 128, {"src[0]": handle}, {}, CheckpointSummary()
            )
        )


def test_checkpoint_storage_lists_only_checkpoints_with_metadata(remote: Remote) -> None:
    storage = CheckpointStorage(remote.root, storage_options=remote.options)
    assert storage.checkpoint_ids() == [] and not storage.exists()
    write_checkpoint(storage, 1)
    write_checkpoint(storage, 2)
    write_checkpoint(storage, 3, metadata=False)  # in progress, or its job died
    assert storage.checkpoint_ids() == [1, 2, 3] and storage.completed_checkpoints() == [1, 2]
    statuses = [info.status for info in storage.list()]
    assert statuses == [CheckpointStatus.COMPLETED] * 2 + [CheckpointStatus.INCOMPLETE]
    assert storage.latest_valid() is not None and storage.latest_valid()[0] == 2  # type: ignore[index]
    resolved, n = CheckpointStorage.resolve(remote.root, remote.options)
    assert n == 2 and resolved.root == remote.root
    resolved, n = CheckpointStorage.resolve(f"{remote.root}/chk-1/", remote.options)
    assert n == 1 and resolved.root == remote.root


def test_retain_and_discard_remove_whole_prefixes(remote: Remote) -> None:
    storage = CheckpointStorage(remote.root, storage_options=remote.options)
    for n in (1, 2, 4):
        write_checkpoint(storage, n)
    write_checkpoint(storage, 3, metadata=False)  # older than the newest completed: aborted
    write_checkpoint(storage, 5, metadata=False)  # newer: may be in progress, kept
    assert storage.retain(2) == [1, 3]
    assert storage.checkpoint_ids() == [2, 4, 5]
    assert not remote.fs.exists(storage.task_state_path(1, "src[0]"))
    storage.discard(5)
    assert storage.checkpoint_ids() == [2, 4]


def test_missing_and_corrupt_metadata_errors_name_the_url(remote: Remote) -> None:
    storage = CheckpointStorage(remote.root, storage_options=remote.options)
    write_checkpoint(storage, 1, metadata=False)
    with pytest.raises(CheckpointNotFoundError) as missing:
        storage.read_metadata(1)
    assert f"{remote.root}/chk-1/{METADATA}" in str(missing.value)
    remote.fs.write_whole(f"{remote.root}/chk-1/{METADATA}", b'{"checkpoint_id": 1')
    with pytest.raises(CorruptCheckpointError) as corrupt:
        storage.check(1)
    assert f"{remote.root}/chk-1/{METADATA}" in str(corrupt.value)
    with pytest.raises(CheckpointNotFoundError, match=remote.root):
        CheckpointStorage.resolve(remote.root, remote.options)


def test_warm_up_builds_the_client_and_leaves_errors_to_the_first_write(s3: FakeS3) -> None:
    options = {**s3.options, "skip_instance_cache": True}  # a client of its own
    storage = CheckpointStorage("s3://absflow-no-such-bucket/chk", storage_options=options)
    fsspec_fs = storage.fs
    assert isinstance(fsspec_fs, FsspecFileSystem) and fsspec_fs.fs._s3 is None
    storage.warm_up()  # no error here: the first state write reports it, naming the host
    assert fsspec_fs.fs._s3 is not None
    with pytest.raises(StorageAccessError, match="no-such-bucket"):
        storage.write_metadata(
            CheckpointMetadata(1, "job", 0, False, 1.0, 2.0, 1.0, 128, {}, {}, CheckpointSummary())
        )
