"""The in-order buffer of a blocked channel, spilling to a task-local file.

While a channel is blocked during barrier alignment its frames must be kept, in
order, until it is unblocked; under skew that can be far more than fits in memory.
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections import deque
from collections.abc import Callable
from typing import IO, Self

import lz4.block

from statebackend.errors import CorruptStateError, StateError
from statebackend.fs import unlink_quietly

_LEN = struct.Struct(">I")


class SpillBuffer:
    """In-order buffer of frames (bytes) of one blocked channel; spills to a task-local
    temp file past a memory threshold.

    Frames stay in memory while ``in_memory_bytes`` stays within ``memory_threshold``.
    From the first frame that would exceed it, appends go to the file (each frame as a
    4-byte big-endian length + an lz4 block) until the file has been read back to its
    end: the memory part is always older than the file part, so order is preserved
    with appends and poplefts interleaved in any way. A drained file is deleted; the
    next spill creates a new one.

    Threading: one owner thread (the task loop). ``close()`` removes the file and is
    idempotent; the buffer is unusable after it.
    """

    def __init__(
        self, directory: str | Callable[[], str], memory_threshold: int = 8 * 1024 * 1024
    ) -> None:
        """``directory``: where to spill, or a callable giving it at the first spill (so a
        buffer that never spills never creates its directory)."""
        self.directory = directory
        self.memory_threshold = memory_threshold
        self.spilled_bytes = 0
        """Total payload bytes ever written to disk (uncompressed) — a metric."""
        self.in_memory_bytes = 0
        self._memory: deque[bytes] = deque()
        self._file: IO[bytes] | None = None
        self._path: str | None = None
        self._file_frames = 0
        self._read_pos = 0
        self._write_pos = 0
        self._closed = False

    @property
    def path(self) -> str | None:
        """The current spill file, or None while everything is in memory."""
        return self._path

    def __len__(self) -> int:
        return len(self._memory) + self._file_frames

    def __bool__(self) -> bool:
        return bool(self._memory) or self._file_frames > 0

    def append(self, frame: bytes) -> None:
        """Add ``frame`` as the newest."""
        if self._file is None:
            size = len(frame)
            if self.in_memory_bytes + size <= self.memory_threshold:
                self._memory.append(frame)
                self.in_memory_bytes += size
                return
            self._open_file()
        f = self._file
        assert f is not None
        body = lz4.block.compress(frame, store_size=True)
        f.seek(self._write_pos)
        f.write(_LEN.pack(len(body)))
        f.write(body)
        self._write_pos += _LEN.size + len(body)
        self._file_frames += 1
        self.spilled_bytes += len(frame)

    def popleft(self) -> bytes:
        """Remove and return the oldest frame; IndexError if empty."""
        if self._memory:
            head = self._memory.popleft()
            self.in_memory_bytes -= len(head)
            return head
        f = self._file
        if f is None or self._file_frames == 0:
            raise IndexError("popleft from an empty SpillBuffer")
        f.seek(self._read_pos)
        prefix = f.read(_LEN.size)
        length = _LEN.unpack(prefix)[0] if len(prefix) == _LEN.size else -1
        body = f.read(length) if length >= 0 else b""
        if len(body) != length:
            raise CorruptStateError(
                str(self._path), f"spill file truncated at offset {self._read_pos}"
            )
        self._read_pos += _LEN.size + length
        self._file_frames -= 1
        if self._file_frames == 0:
            self._remove_file()
        frame: bytes = lz4.block.decompress(body)
        return frame

    def rotate(self, visit: Callable[[bytes], None]) -> None:
        """Pass every frame, oldest first, to ``visit``, keeping them all, in order."""
        for _ in range(len(self)):
            frame = self.popleft()
            visit(frame)
            self.append(frame)

    def close(self) -> None:
        """Drop all frames and remove the spill file; idempotent."""
        self._closed = True
        self._memory.clear()
        self.in_memory_bytes = 0
        self._remove_file()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open_file(self) -> None:
        if self._closed:
            raise StateError(f"SpillBuffer in {self.directory!r} is closed")
        if callable(self.directory):
            self.directory = self.directory()
        fd, self._path = tempfile.mkstemp(dir=self.directory, prefix="absflow-spill-")
        self._file = os.fdopen(fd, "w+b")
        self._read_pos = self._write_pos = 0
        self._file_frames = 0

    def _remove_file(self) -> None:
        f, path = self._file, self._path
        self._file = self._path = None
        self._file_frames = 0
        self._read_pos = self._write_pos = 0
        if f is not None:
            f.close()
        if path is not None:
            unlink_quietly(path)
