"""The filesystem interface checkpoint storage writes through, and its local implementation.

`CheckpointStorage` needs only a few operations, listed by `FileSystem`; each says
what it promises, so that a store without rename (S3 and friends, through fsspec)
can implement it: a whole-file write is "create in one PUT", a streaming write is a
multipart upload that becomes visible when it is closed.

Paths are the filesystem's own strings (a local path here; a full URL such as
``s3://bucket/prefix/chk-3/_metadata`` for `statebackend.fsspec_fs.FsspecFileSystem`).
`filesystem_for` turns a storage URL into a filesystem and a root path.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, Protocol

FILE_SCHEME = "file://"


class FileSystem(Protocol):
    """What checkpoint storage does with files. Safe to call from any thread."""

    def join(self, *parts: str) -> str:
        """The path of ``parts[-1]`` inside ``parts[0]/.../parts[-2]``."""
        ...

    def write_whole(self, path: str, data: bytes) -> None:
        """Write ``data`` as the whole file ``path``: afterwards ``path`` holds all of it,
        or (on an error, or a crash half-way) is as it was before. Parents are created."""
        ...

    def open_write(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """A stream whose bytes become the file ``path`` when the ``with`` block ends
        without an error; an error (or a crash) inside the block leaves no file at
        ``path``. Parents are created."""
        ...

    def open_write_part(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        """Like `open_write`, for a file that a later `write_whole` in the same directory
        publishes (a task's state file, published by the checkpoint's ``_metadata``):
        nothing reads it before then, and readers check its size and crc. So it need not
        appear atomically: a crash inside the block may leave part of it at ``path``
        (an error removes it). Its bytes are durable when the block ends; its name, at the
        latest when that `write_whole` ends. Parents are created."""
        ...

    def open_read(self, path: str) -> BinaryIO:
        """The file for reading; FileNotFoundError if it does not exist."""
        ...

    def read_bytes(self, path: str) -> bytes:
        """The whole file; FileNotFoundError if it does not exist."""
        ...

    def list_dir(self, path: str) -> list[str]:
        """Names of the entries of directory ``path``; FileNotFoundError if it does not exist."""
        ...

    def list_dirs(self, path: str) -> list[str]:
        """Names of the directories in directory ``path`` (on an object store: the key
        prefixes one level down, in one listing); FileNotFoundError if it does not exist."""
        ...

    def is_dir(self, path: str) -> bool: ...

    def exists(self, path: str) -> bool: ...

    def size(self, path: str) -> int:
        """Size in bytes; FileNotFoundError if the file does not exist."""
        ...

    def remove(self, path: str) -> None:
        """Remove a file; a missing file is fine."""
        ...

    def remove_tree(self, path: str) -> None:
        """Remove a directory and everything in it; a missing directory is fine."""
        ...


def unlink_quietly(path: str) -> None:
    """Remove local file ``path``; a missing file is fine."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def _fsync_dir(directory: str) -> None:
    """Persist renames in ``directory`` (no-op where directories cannot be fsynced)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class LocalFileSystem:
    """A local (or NFS-mounted) directory tree. Writes go to ``path + ".tmp"``, are
    fsynced and renamed into place, and the directory is fsynced: atomic on POSIX.

    A part (`open_write_part`) is written in place and fsynced, without the rename and
    the directory fsync: one flush to disk instead of two per task state file. The
    directory fsync of the `write_whole` that publishes it makes its name durable with
    every other entry of the directory, as fsync of a directory persists its entries.
    """

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def write_whole(self, path: str, data: bytes) -> None:
        with self.open_write(path) as out:
            out.write(data)

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[BinaryIO]:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        tmp = path + ".tmp"
        try:
            with open(tmp, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            unlink_quietly(tmp)
            raise
        _fsync_dir(directory)

    @contextlib.contextmanager
    def open_write_part(self, path: str) -> Iterator[BinaryIO]:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        try:
            with open(path, "wb") as out:
                yield out
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            unlink_quietly(path)
            raise

    def open_read(self, path: str) -> BinaryIO:
        return open(path, "rb")

    def read_bytes(self, path: str) -> bytes:
        with open(path, "rb") as f:
            return f.read()

    def list_dir(self, path: str) -> list[str]:
        return os.listdir(path)

    def list_dirs(self, path: str) -> list[str]:
        with os.scandir(path) as entries:
            return [e.name for e in entries if e.is_dir()]

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(path)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def size(self, path: str) -> int:
        return os.path.getsize(path)

    def remove(self, path: str) -> None:
        unlink_quietly(path)

    def remove_tree(self, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def __repr__(self) -> str:
        return "LocalFileSystem()"


def filesystem_for(
    url: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[FileSystem, str]:
    """The filesystem of a storage URL and the root path in it.

    A plain path or a ``file://`` URL is a local directory (made absolute against the
    current directory of the caller: resolve on the driver, hand the result to tasks);
    ``storage_options`` do not apply to it. Any other ``scheme://`` (``s3://``,
    ``hdfs://``, ``memory://``, ...) goes through fsspec (`statebackend.fsspec_fs`),
    which gets ``storage_options`` (endpoint, credentials, ...); the root keeps its
    scheme, so every path and every message is a full URL. Raises StateError for a
    scheme fsspec does not know or whose package is not installed.
    """
    if url.startswith(FILE_SCHEME):
        url = url[len(FILE_SCHEME) :]
    elif "://" in url:
        from statebackend.fsspec_fs import FsspecFileSystem  # fsspec only when needed

        fs = FsspecFileSystem.for_url(url, storage_options or {})
        return fs, url.rstrip("/")
    return LocalFileSystem(), os.path.abspath(url)
