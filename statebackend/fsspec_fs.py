"""Checkpoint storage on any fsspec filesystem: S3 (s3fs), HDFS (pyarrow), memory, ...

Object stores have no rename, so nothing here renames:

* a whole-file write (``_metadata``, the driver's probe) is one ``pipe_file``: on S3
  a single PUT, which creates the object whole or not at all;
* a streaming write (a task's state file) on S3 is the object store's own writer,
  opened ``"wb"``: it buffers, uploads parts as they fill, and the object appears
  when the file is closed (one PUT for a small file, a multipart upload completed at
  close for a big one). An error inside the ``with`` block discards the writer
  (aborting its multipart upload, dropping its buffer) and marks it closed, so that
  nothing — not even the garbage collector, whose ``__del__`` closes an abandoned
  writer and so would *commit* it — makes the object appear;
* on other filesystems a writer may publish the file while it is written (memory://
  publishes it when opened, HDFS creates it): a streaming write goes to a local
  spool (in memory up to ``SPOOL_IN_MEMORY``, then an anonymous temp file, which a
  killed process leaves nowhere) and is copied there when the block ends without an
  error; a failed copy removes what it left.

Every path is a full URL (``s3://bucket/prefix/chk-3/_metadata``), so errors name
what the user configured. Errors: a missing file on a read is FileNotFoundError (the
callers turn it into "not completed" / "does not exist"); everything else, and any
failure of a write or a removal, is StorageAccessError naming the operation, the URL
and the underlying error (botocore's connection errors are not OSErrors: callers
that handle OSError see them too).

Listings are never served from fsspec's cache: other processes (the tasks, the CLI)
write the same prefix, so each listing query invalidates the cached entries first.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import threading
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO, cast

import fsspec
from fsspec.registry import known_implementations, registry

from statebackend.errors import StateError, StorageAccessError

SPOOL_IN_MEMORY = 16 * 1024 * 1024
"""Bytes a spooled streaming write keeps in memory before it moves to a temp file."""

STREAMING_PROTOCOLS = frozenset({"s3", "s3a"})
"""Filesystems whose own writer makes the object appear only when it is closed, and
can be discarded before that (s3fs's multipart writer). The others are spooled."""

_PACKAGES = {"s3": "s3fs (pip install 'absflow[s3]')", "hdfs": "pyarrow (pip install pyarrow)"}


class FsspecFileSystem:
    """`statebackend.fs.FileSystem` over an fsspec filesystem; paths are full URLs.

    Built by `for_url` without I/O and without importing the implementation: `fs`
    builds it on first use (importing s3fs and building its client take about a second
    of CPU, which a task spends on its writer thread, not before it registers). Safe to
    call from any thread (fsspec's async filesystems run every request on their own
    loop).
    """

    def __init__(self, protocol: str, storage_options: Mapping[str, Any], url: str) -> None:
        self.protocol = protocol
        self.streaming = protocol in STREAMING_PROTOCOLS
        self._options = dict(storage_options)
        self._url = url  # names the storage in a configuration error
        self._fs: Any = None
        self._lock = threading.Lock()

    @classmethod
    def for_url(cls, url: str, storage_options: Mapping[str, Any]) -> FsspecFileSystem:
        """The filesystem of ``url``'s scheme with ``storage_options``. Raises StateError
        at once for a scheme fsspec does not know."""
        protocol = url.split("://", 1)[0].lower()
        if protocol not in known_implementations and protocol not in registry:
            raise StateError(
                f"checkpoint storage {url!r}: fsspec does not know the {protocol}:// scheme; "
                f"use a local path, file://, s3:// or hdfs://"
            )
        return cls(protocol, storage_options, url)

    @property
    def fs(self) -> Any:
        """The fsspec filesystem (fsspec caches instances per options). Raises StateError
        naming the package to install, or options that do not fit."""
        if self._fs is None:
            with self._lock:
                if self._fs is None:
                    self._fs = self._build()
        return self._fs

    def _build(self) -> Any:
        url, protocol, options = self._url, self.protocol, self._options
        try:  # from the URL too: hdfs://namenode:8020/... names its namenode
            fs, _path = fsspec.core.url_to_fs(url, **options)
            return fs
        except ImportError as err:
            package = _PACKAGES.get(protocol, "the fsspec implementation of this scheme")
            raise StateError(f"checkpoint storage {url!r} needs {package}: {err}") from err
        except (TypeError, ValueError) as err:
            raise StateError(
                f"checkpoint storage {url!r}: storage_options {sorted(options)} do not fit "
                f"the {protocol}:// filesystem ({err}); see its fsspec documentation"
            ) from err

    def __repr__(self) -> str:
        return f"FsspecFileSystem({self.protocol}://)"

    # -- paths ---------------------------------------------------------------------------
    def join(self, *parts: str) -> str:
        head, *rest = parts
        return "/".join([head.rstrip("/"), *(p.strip("/") for p in rest)])

    # -- writing -------------------------------------------------------------------------
    def write_whole(self, path: str, data: bytes) -> None:
        with _errors("write", path, missing_is_error=True):
            self.fs.pipe_file(path, data)

    @contextlib.contextmanager
    def open_write(self, path: str) -> Iterator[BinaryIO]:
        if self.streaming:
            with self._streamed(path) as out:
                yield out
        else:
            with self._spooled(path) as out:
                yield out

    def open_write_part(self, path: str) -> contextlib.AbstractContextManager[BinaryIO]:
        return self.open_write(path)  # an object appears whole, and is durable, on its PUT

    @contextlib.contextmanager
    def _streamed(self, path: str) -> Iterator[BinaryIO]:
        with _errors("write", path, missing_is_error=True):
            out = self.fs.open(path, "wb")  # an AbstractBufferedFile: uploads, commits on close
        try:
            yield cast(BinaryIO, out)
            with _errors("write", path, missing_is_error=True):
                out.close()  # the object appears here
        except BaseException:
            _abandon(out)
            raise

    @contextlib.contextmanager
    def _spooled(self, path: str) -> Iterator[BinaryIO]:
        with tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) as spool:
            yield cast(BinaryIO, spool)
            spool.seek(0)
            try:
                with _errors("write", path, missing_is_error=True), self.fs.open(path, "wb") as out:
                    shutil.copyfileobj(spool, out, 1024 * 1024)
            except BaseException:
                with contextlib.suppress(Exception):
                    self.remove(path)
                raise

    # -- reading -------------------------------------------------------------------------
    def open_read(self, path: str) -> BinaryIO:
        with _errors("read", path):
            return cast(BinaryIO, self.fs.open(path, "rb"))

    def read_bytes(self, path: str) -> bytes:
        with _errors("read", path):
            return bytes(self.fs.cat_file(path))

    def list_dir(self, path: str) -> list[str]:
        return [name for name, _is_dir in self._entries(path)]

    def list_dirs(self, path: str) -> list[str]:
        return [name for name, is_dir in self._entries(path) if is_dir]

    def _entries(self, path: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of each entry of ``path``: one listing request."""
        self.fs.invalidate_cache(path)
        with _errors("list", path):
            entries = self.fs.ls(path, detail=True)
        own = self.fs._strip_protocol(path).rstrip("/")
        found = []
        for entry in entries:
            name = str(entry["name"]).rstrip("/")
            if name != own:
                found.append((name.rsplit("/", 1)[-1], entry.get("type") == "directory"))
        return found

    def is_dir(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        with _errors("inspect", path, missing_is_error=True):
            return bool(self.fs.isdir(path))

    def exists(self, path: str) -> bool:
        self.fs.invalidate_cache(path)
        with _errors("inspect", path, missing_is_error=True):
            return bool(self.fs.exists(path))

    def size(self, path: str) -> int:
        self.fs.invalidate_cache(path)
        with _errors("inspect", path):
            size = self.fs.size(path)
        if size is None:
            raise FileNotFoundError(2, "no size (not a file)", path)
        return int(size)

    # -- removing ------------------------------------------------------------------------
    def remove(self, path: str) -> None:
        try:
            with _errors("remove", path):
                self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str) -> None:
        """Every object under the prefix ``path/`` (object stores have no directories)."""
        self.fs.invalidate_cache(path)
        try:
            with _errors("remove", path):
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


def _abandon(out: Any) -> None:
    """Throw an unfinished upload away: abort its multipart upload (if one was started)
    and mark it closed, so that nothing (not close(), not ``__del__``) commits it."""
    with contextlib.suppress(Exception):
        out.discard()
    out.closed = True


@contextlib.contextmanager
def _errors(operation: str, url: str, missing_is_error: bool = False) -> Iterator[None]:
    """FileNotFoundError stays one (naming ``url``) unless ``missing_is_error`` (a missing
    bucket on a write); every other failure becomes StorageAccessError naming ``url``."""
    try:
        yield
    except StateError:
        raise
    except FileNotFoundError as err:
        if not missing_is_error:
            raise FileNotFoundError(2, _message(err), url) from err
        raise StorageAccessError(
            f"cannot {operation} {url!r}: {_message(err)} (does the bucket or the "
            f"parent directory exist?)"
        ) from err
    except Exception as err:
        raise StorageAccessError(
            f"cannot {operation} {url!r}: {type(err).__name__}: {_message(err)}"
        ) from err


def _message(err: BaseException) -> str:
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    return str(err) or type(err).__name__
