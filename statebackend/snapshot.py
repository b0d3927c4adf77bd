"""One task's state file: the operator state and keyed state of its operators.

Writing is the asynchronous part of a checkpoint: it runs in a background thread on
the immutable blobs captured synchronously (``OperatorSnapshot``), while the task goes
on processing. This module is the file format only: `encode_task_snapshot` gives the
bytes and the readers take an open file; where the file goes is
``statebackend.storage.CheckpointStorage``'s business (`write_task_snapshot` and the
path-taking readers are the local-file conveniences of tests and benchmarks).

File format (all integers big-endian)::

    offset  size
    0       8     magic  b"ABSFSTAT"
    8       2     format version (1)
    10      2     flags: 0, or FLAG_RAW (1): the sections are stored as they are
    12      4     header length H
    16      4     crc32 of the header
    20      H     header, msgpack: {"operators": {op: [keyed, kg_start, kg_stop]},
                                    "sections": [[op, kind, key_group, offset, length,
                                                  crc32, raw_length], ...],
                                    "data_length": int}
    20+H    ...   sections, each a msgpack blob: an lz4 block of it (size stored), or
                  with FLAG_RAW the blob itself

A task compresses its sections only with ``JobConfig.snapshot_compression`` (as in
Flink, off by default): on local disk lz4 costs the writer thread more CPU than the
bytes it saves cost to write (``benchmarks/snapshot_compression.py``), and that CPU
is taken from the task processes, on a loaded machine at two to three times its
length in wall time; on an object store, where bytes cost time and money, it can pay.
Readers take either form.

Section offsets are relative to the end of the header; ``kind`` is ``"operator"``
(key group -1) or ``"keyed"``. The task writes keyed state as one section per operator
(key group -2) holding the instance's whole key-group range, whose keys a restore
filters by key group; a writer given a key-group function for an operator (tests,
benchmarks) writes one section per key group present instead. Each section's
crc32 covers its bytes on disk; a reader verifies the header and every section it
reads, so a truncated or bit-flipped file raises :class:`CorruptStateError`.
"""

from __future__ import annotations

import contextlib
import io
import os
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, BinaryIO

import lz4.block
import msgpack

from statebackend.errors import CorruptStateError, StateError
from statebackend.fs import LocalFileSystem
from statebackend.keyed import KeyedStateBackend

MAGIC = b"ABSFSTAT"
FILE_VERSION = 1
_PREFIX = struct.Struct(">8sHHII")  # magic, version, flags, header length, header crc32
FLAG_RAW = 0x0001
"""Prefix flag: the sections are the msgpack blobs as they are, not lz4 blocks of them."""
OPERATOR_SECTION = "operator"
KEYED_SECTION = "keyed"
WHOLE_RANGE = -2  # key group of a keyed section holding the instance's whole range
_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class OperatorSnapshot:
    """The captured state of one operator of a task (the synchronous part's output)."""

    operator_state: bytes | None
    """msgpack blob of the operator's own state (source offsets, sink transactions)."""
    keyed_state: bytes | SpooledBlob | None
    """:meth:`KeyedStateBackend.snapshot` blob (or the same bytes spooled to local files:
    a state larger than memory), or None."""
    key_groups: range | None
    """Key groups this instance owned (None if the operator is not keyed)."""


@dataclass(frozen=True, slots=True)
class SpooledBlob:
    """A blob too large to hold in memory, as local files: the concatenation of
    ``parts`` (bytes held here, or the path of a local file), ``size`` bytes whose crc32
    is ``crc32``. A state file copies it in as one section (``statebackend.rocksdb``'s
    canonical savepoints); `discard` removes the files."""

    parts: tuple[bytes | str, ...]
    size: int
    crc32: int

    @classmethod
    def of(cls, parts: tuple[bytes | str, ...]) -> SpooledBlob:
        """The blob of ``parts``, its size and crc32 read from them."""
        size = crc = 0
        blob = cls(parts, 0, 0)
        for chunk in blob.chunks():
            size += len(chunk)
            crc = zlib.crc32(chunk, crc)
        return cls(parts, size, crc)

    def chunks(self) -> Iterator[bytes]:
        for part in self.parts:
            if isinstance(part, bytes):
                yield part
                continue
            with open(part, "rb") as f:
                while chunk := f.read(_CHUNK):
                    yield chunk

    def __len__(self) -> int:
        return self.size

    def read(self) -> bytes:
        """The whole blob in memory (small blobs: inline handles, tests)."""
        return b"".join(self.chunks())

    def discard(self) -> None:
        for part in self.parts:
            if isinstance(part, str):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(part)


@dataclass(frozen=True, slots=True)
class StateFileInfo:
    """What the checkpoint metadata records about a written state file."""

    path: str
    size: int
    crc32: int
    sections: int


@dataclass(frozen=True, slots=True)
class _Section:
    operator: str
    kind: str
    key_group: int
    offset: int
    length: int
    crc32: int
    raw_length: int

    def describe(self) -> str:
        where = "operator state" if self.kind == OPERATOR_SECTION else f"key group {self.key_group}"
        return f"section {self.operator!r} {where} (offset {self.offset}, {self.length} bytes)"


@dataclass(frozen=True, slots=True)
class _Header:
    operators: dict[str, list[Any]]
    sections: list[_Section]
    data_start: int
    data_length: int
    compressed: bool


@dataclass(frozen=True, slots=True)
class EncodedSnapshot:
    """The bytes of one state file, in order, and their total size."""

    chunks: tuple[bytes | SpooledBlob, ...]
    size: int
    sections: int


def encode_task_snapshot(
    operators: Mapping[str, OperatorSnapshot],
    key_group_fns: Mapping[str, Callable[[Any], int]] | None = None,
    compress: bool = False,
) -> EncodedSnapshot:
    """The state file of one task's operators (asynchronous part; any thread; no I/O).

    Keyed state is one whole-range section per operator, unless ``key_group_fns[op]``
    (key -> key group) is given for operator ``op``: then one section per key group.
    ``compress``: each section an lz4 block; else the blobs as they are (no copy). A
    spooled blob is copied in as it is, so a file holding one is not compressed.
    """
    fns = key_group_fns or {}
    payloads: list[tuple[str, str, int, bytes | SpooledBlob]] = []  # op, kind, kg, raw blob
    op_index: dict[str, list[Any]] = {}
    for op, snap in operators.items():
        kgs = snap.key_groups
        keyed = kgs is not None or snap.keyed_state is not None
        op_index[op] = [keyed, kgs.start if kgs else None, kgs.stop if kgs else None]
        if snap.operator_state is not None:
            payloads.append((op, OPERATOR_SECTION, -1, snap.operator_state))
        if snap.keyed_state is not None:
            fn = fns.get(op)
            if fn is None or isinstance(snap.keyed_state, SpooledBlob):
                # One section for the instance's whole key-group range: no regrouping in
                # the writer (cheap; it competes with the task loop for the GIL); a restore
                # filters the keys by key group instead.
                payloads.append((op, KEYED_SECTION, WHOLE_RANGE, snap.keyed_state))
                continue
            for kg, blob in KeyedStateBackend.split_by_key_group(snap.keyed_state, fn).items():
                payloads.append((op, KEYED_SECTION, kg, blob))

    compress = compress and not any(isinstance(raw, SpooledBlob) for *_, raw in payloads)
    sections: list[list[Any]] = []
    bodies: list[bytes | SpooledBlob] = []
    offset = 0
    for op, kind, kg, raw in payloads:
        if isinstance(raw, SpooledBlob):
            sections.append([op, kind, kg, offset, raw.size, raw.crc32, raw.size])
            bodies.append(raw)
            offset += raw.size
            continue
        body = lz4.block.compress(raw, store_size=True) if compress else raw
        sections.append([op, kind, kg, offset, len(body), zlib.crc32(body), len(raw)])
        bodies.append(body)
        offset += len(body)
    header = msgpack.packb(
        {"operators": op_index, "sections": sections, "data_length": offset},
        use_bin_type=True,
    )
    flags = 0 if compress else FLAG_RAW
    prefix = _PREFIX.pack(MAGIC, FILE_VERSION, flags, len(header), zlib.crc32(header))
    return EncodedSnapshot(
        (prefix, header, *bodies), len(prefix) + len(header) + offset, len(sections)
    )


def write_chunks(out: BinaryIO, chunks: tuple[bytes | SpooledBlob, ...]) -> int:
    """Write ``chunks`` to ``out``; return the crc32 of everything written."""
    crc = 0
    for chunk in chunks:
        for piece in chunk.chunks() if isinstance(chunk, SpooledBlob) else (chunk,):
            out.write(piece)
            crc = zlib.crc32(piece, crc)
    return crc


def joined(chunks: tuple[bytes | SpooledBlob, ...]) -> bytes:
    """``chunks`` as one bytes object (a small state: an inline handle)."""
    return b"".join(c.read() if isinstance(c, SpooledBlob) else c for c in chunks)


def write_task_snapshot(
    path: str,
    operators: Mapping[str, OperatorSnapshot],
    key_group_fns: Mapping[str, Callable[[Any], int]] | None = None,
    compress: bool = False,
) -> StateFileInfo:
    """Write one task's state file to local ``path`` atomically (``path + ".tmp"``,
    fsync, rename, directory fsync): ``path`` either does not exist or is complete.

    The local-file convenience of tests and benchmarks; tasks write through
    ``CheckpointStorage.write_task_state``. The crc32 covers the whole file.
    """
    encoded = encode_task_snapshot(operators, key_group_fns, compress)
    with LocalFileSystem().open_write(path) as out:
        crc = write_chunks(out, encoded.chunks)
    return StateFileInfo(path=path, size=encoded.size, crc32=crc, sections=encoded.sections)


StateSource = str | BinaryIO
"""A state file to read: a local path, or a file opened for binary reading (left open)."""


def read_operator_state(source: StateSource, operator: str) -> bytes | None:
    """The operator-state blob of ``operator``, or None if the file has none for it."""
    with _open(source) as (f, path):
        header = _read_header(f, path)
        for section in header.sections:
            if section.operator == operator and section.kind == OPERATOR_SECTION:
                return _read_section(f, path, header, section)
    return None


def read_keyed_state(source: StateSource, operator: str, key_groups: range) -> list[bytes]:
    """Keyed-state blobs of ``operator`` for those of ``key_groups`` present in the file,
    in key-group order (feed them to :meth:`KeyedStateBackend.restore`, which keeps only
    the keys of its own key groups: a whole-range section may hold others)."""
    with _open(source) as (f, path):
        header = _read_header(f, path)
        return [_read_section(f, path, header, s) for s in _keyed(header, operator, key_groups)]


def keyed_state_streams(f: BinaryIO, operator: str, key_groups: range) -> Iterator[BinaryIO]:
    """As `read_keyed_state`, each blob a stream read from the open file ``f`` (a state
    larger than memory: ``KeyedStateBackend.restore_streams``). Read each stream before
    taking the next; the last read of a stream checks its crc32 (CorruptStateError).
    A compressed section is decompressed whole."""
    path = str(getattr(f, "name", "<state file>"))
    header = _read_header(f, path)
    for section in _keyed(header, operator, key_groups):
        if header.compressed:
            yield io.BytesIO(_read_section(f, path, header, section))
        else:
            yield io.BufferedReader(_SectionStream(f, path, header.data_start, section), _CHUNK)


def _keyed(header: _Header, operator: str, key_groups: range) -> list[_Section]:
    """The keyed sections of ``operator`` overlapping ``key_groups``, by key group."""
    owned = header.operators.get(operator)
    whole = (
        owned is not None
        and owned[1] is not None
        and owned[1] < key_groups.stop
        and key_groups.start < owned[2]
    )
    wanted = [
        s
        for s in header.sections
        if s.operator == operator
        and s.kind == KEYED_SECTION
        and (s.key_group in key_groups or (s.key_group == WHOLE_RANGE and whole))
    ]
    wanted.sort(key=lambda s: s.key_group)
    return wanted


class _SectionStream(io.RawIOBase):
    """One raw section of a state file as a stream: reads stop at its end, where its
    crc32 is checked."""

    def __init__(self, f: BinaryIO, path: str, data_start: int, section: _Section) -> None:
        self._f, self._path, self._section = f, path, section
        self._at = data_start + section.offset
        self._left = section.length
        self._crc = 0

    def readable(self) -> bool:
        return True

    def readall(self) -> bytes:
        """The rest of the section, in one read."""
        parts = []
        while self._left:
            self._f.seek(self._at)
            data = self._f.read(self._left)
            self._take(data)
            parts.append(data)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        if not self._left or not len(view):
            return 0
        self._f.seek(self._at)
        data = self._f.read(min(len(view), self._left))
        self._take(data)
        view[: len(data)] = data
        return len(data)

    def _take(self, data: bytes) -> None:
        """Count ``data`` read; at the section's end, check its crc32."""
        section = self._section
        if not data:
            raise CorruptStateError(
                self._path, f"truncated in {section.describe()}: {self._left} bytes missing"
            )
        self._at += len(data)
        self._left -= len(data)
        self._crc = zlib.crc32(data, self._crc)
        if not self._left and self._crc != section.crc32:
            raise CorruptStateError(
                self._path,
                f"crc32 mismatch in {section.describe()}: {self._crc:#010x}, expected "
                f"{section.crc32:#010x}",
            )


def list_operators(source: StateSource) -> dict[str, dict[str, Any]]:
    """operator -> {"keyed": bool, "key_groups": [first, last] or None} (header only)."""
    with _open(source) as (f, path):
        header = _read_header(f, path)
    result: dict[str, dict[str, Any]] = {}
    for op, (keyed, start, stop) in header.operators.items():
        groups = [start, stop - 1] if start is not None and stop > start else None
        result[op] = {"keyed": bool(keyed), "key_groups": groups}
    return result


def verify_state_file(source: StateSource, expected_crc32: int | None = None) -> None:
    """Check the whole file: header, every section's crc32, the exact size, and (if
    given) the whole-file crc32 recorded in the checkpoint metadata.

    Raises CorruptStateError naming the path and the first failed check.
    """
    with _open(source) as (f, path):
        header = _read_header(f, path)
        for section in sorted(header.sections, key=lambda s: s.offset):
            _read_section(f, path, header, section, decompress=False)
        end = header.data_start + header.data_length
        actual = f.seek(0, os.SEEK_END)
        if actual != end:
            raise CorruptStateError(
                path, f"size is {actual} bytes, the header says {end} (trailing bytes)"
            )
        if expected_crc32 is not None:
            f.seek(0)
            crc = 0
            while chunk := f.read(_CHUNK):
                crc = zlib.crc32(chunk, crc)
            if crc != expected_crc32:
                raise CorruptStateError(
                    path,
                    f"file crc32 is {crc:#010x}, the checkpoint recorded {expected_crc32:#010x}",
                )


@contextlib.contextmanager
def _open(source: StateSource) -> Iterator[tuple[BinaryIO, str]]:
    if not isinstance(source, str):
        yield source, str(getattr(source, "name", "<state file>"))
        return
    if not os.path.exists(source):
        raise StateError(
            f"state file {source!r} does not exist; the checkpoint is incomplete — restore "
            f"another one (list them with `python -m jobmanager checkpoints DIR`)"
        )
    with open(source, "rb") as f:
        yield f, source


def _read_header(f: BinaryIO, path: str) -> _Header:
    raw = f.read(_PREFIX.size)
    if len(raw) < _PREFIX.size:
        raise CorruptStateError(path, f"truncated: {len(raw)} bytes, shorter than the file prefix")
    magic, version, flags, header_len, header_crc = _PREFIX.unpack(raw)
    if magic != MAGIC:
        raise CorruptStateError(path, f"bad magic {magic!r}, expected {MAGIC!r}: not a state file")
    if version != FILE_VERSION:
        raise CorruptStateError(
            path, f"format version {version}, this absflow reads version {FILE_VERSION}"
        )
    if flags & ~FLAG_RAW:
        raise CorruptStateError(
            path, f"unknown flags {flags:#06x} (a newer absflow's file, or a damaged prefix)"
        )
    header_bytes = f.read(header_len)
    if len(header_bytes) < header_len:
        raise CorruptStateError(
            path, f"truncated in the header ({len(header_bytes)} of {header_len} bytes)"
        )
    if zlib.crc32(header_bytes) != header_crc:
        raise CorruptStateError(path, "header crc32 mismatch")
    try:
        decoded = msgpack.unpackb(header_bytes, use_list=True)
        sections = [_Section(*entry) for entry in decoded["sections"]]
        return _Header(
            operators=decoded["operators"],
            sections=sections,
            data_start=_PREFIX.size + header_len,
            data_length=decoded["data_length"],
            compressed=not flags & FLAG_RAW,
        )
    except (ValueError, KeyError, TypeError, msgpack.UnpackException) as err:
        raise CorruptStateError(path, f"header does not decode: {err}") from err


def _read_section(
    f: BinaryIO, path: str, header: _Header, section: _Section, decompress: bool = True
) -> bytes:
    f.seek(header.data_start + section.offset)
    body = f.read(section.length)
    if len(body) < section.length:
        raise CorruptStateError(
            path, f"truncated in {section.describe()}: only {len(body)} bytes left"
        )
    crc = zlib.crc32(body)
    if crc != section.crc32:
        raise CorruptStateError(
            path,
            f"crc32 mismatch in {section.describe()}: {crc:#010x}, expected {section.crc32:#010x}",
        )
    if not header.compressed:
        if len(body) != section.raw_length:
            raise CorruptStateError(
                path, f"{section.describe()} says it holds {section.raw_length} bytes"
            )
        return body
    if not decompress:
        return body
    try:
        raw: bytes = lz4.block.decompress(body)
    except lz4.block.LZ4BlockError as err:
        raise CorruptStateError(path, f"{section.describe()} does not decompress: {err}") from err
    return raw
